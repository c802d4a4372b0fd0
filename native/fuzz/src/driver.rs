//! The fuzzing loop: corpus first, then generated and mutated inputs until the budget is spent; panics
//! caught and written out, hangs caught by a watchdog thread.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mutate::mutate;
use crate::rng::Rng;
use crate::targets::{fnv, Target};

pub struct Budget {
    pub time: Duration,
    pub execs: Option<u64>,
}

pub struct Options {
    pub targets: Vec<&'static Target>,
    pub budget: Budget,
    pub seed: u64,
    pub timeout: Duration,
    pub corpus: PathBuf,
    pub crashes: PathBuf,
}

/// The pool keeps at most this many inputs beyond the corpus.
const MAX_POOL: usize = 2000;

/// What the panic hook saw last: the message and where.
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!(" at {l}")).unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = format!("{message}{location}");
    }));
}

/// Runs one input; the panic message if it panicked.
fn run_one(target: &Target, input: &[u8]) -> Result<u64, String> {
    panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input)))
        .map_err(|_| LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// The corpus files of a target, sorted by name so runs are reproducible.
fn load_corpus(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, String> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            std::fs::read(&p)
                .map(|bytes| (p.clone(), bytes))
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

/// Writes a failing input; returns its path.
fn save(options: &Options, target: &Target, kind: &str, input: &[u8]) -> PathBuf {
    let path = options
        .crashes
        .join(format!("{}-{kind}-{:016x}.bin", target.name, fnv(input)));
    if let Err(e) = std::fs::create_dir_all(&options.crashes).and_then(|()| std::fs::write(&path, input)) {
        eprintln!("cannot write {}: {e}", path.display());
    }
    path
}

/// Tells the watchdog the target is finished.
const FINISHED: u64 = u64::MAX;

/// Exits the process with the input in flight when no input finished for `timeout`.
fn watchdog(options: &Options, target: &'static Target, execs: Arc<AtomicU64>, current: Arc<Mutex<Vec<u8>>>) {
    let timeout = options.timeout;
    let crashes = options.crashes.clone();
    let seed = options.seed;
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        let mut since = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = execs.load(Ordering::Relaxed);
            if now == FINISHED {
                return;
            }
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() > timeout {
                let input = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let options = Options {
                    targets: Vec::new(),
                    budget: Budget {
                        time: Duration::ZERO,
                        execs: None,
                    },
                    seed,
                    timeout,
                    corpus: PathBuf::new(),
                    crashes: crashes.clone(),
                };
                let path = save(&options, target, "hang", &input);
                eprintln!(
                    "fuzz {}: HANG: an input ran over {timeout:?} (seed {seed}, exec {now}); input written to {}",
                    target.name,
                    path.display()
                );
                std::process::exit(1);
            }
        }
    });
}

fn failure(options: &Options, target: &Target, input: &[u8], message: &str, exec: u64) -> String {
    let path = save(options, target, "crash", input);
    format!(
        "fuzz {}: CRASH at exec {exec} (seed {}): {message}\n  input written to {}\n  replay: make fuzz ARGS=\"--target {} --replay {}\"",
        target.name,
        options.seed,
        path.display(),
        target.name,
        path.display()
    )
}

/// One input to try next: generated, structurally changed, or byte-mutated from the pool.
fn next_input(target: &Target, rng: &mut Rng, pool: &[Vec<u8>], dictionary: &[&[u8]]) -> Vec<u8> {
    if pool.is_empty() || rng.below(10) < 2 {
        return (target.generate)(rng);
    }
    let base = &pool[rng.below(pool.len())];
    if rng.below(10) < 4 {
        if let Some(mut changed) = (target.mutate)(rng, base) {
            if rng.one_in(4) {
                let other = &pool[rng.below(pool.len())];
                mutate(rng, &mut changed, other, dictionary);
            }
            return changed;
        }
    }
    let mut input = base.clone();
    let other = &pool[rng.below(pool.len())];
    mutate(rng, &mut input, other, dictionary);
    input
}

fn fuzz_target(options: &Options, target: &'static Target) -> Result<(), String> {
    let corpus = load_corpus(&options.corpus.join(target.name))?;
    let execs = Arc::new(AtomicU64::new(0));
    let current = Arc::new(Mutex::new(Vec::new()));
    watchdog(options, target, execs.clone(), current.clone());
    let start = Instant::now();
    let mut outcomes = HashSet::new();
    for (path, input) in &corpus {
        *current.lock().unwrap_or_else(|e| e.into_inner()) = input.clone();
        let signature = run_one(target, input)
            .map_err(|m| format!("fuzz {}: CRASH on corpus file {}: {m}", target.name, path.display()))?;
        outcomes.insert(signature);
        execs.fetch_add(1, Ordering::Relaxed);
    }
    let mut pool: Vec<Vec<u8>> = corpus.into_iter().map(|(_, input)| input).collect();
    let seeds = pool.len();
    let dictionary = (target.dictionary)();
    // Each target draws from its own stream: adding a target does not change another's inputs.
    let mut rng = Rng::new(options.seed ^ fnv(target.name.as_bytes()));
    let mut exec = 0u64;
    while start.elapsed() < options.budget.time && options.budget.execs.is_none_or(|n| exec < n) {
        let input = next_input(target, &mut rng, &pool, &dictionary);
        current.lock().unwrap_or_else(|e| e.into_inner()).clone_from(&input);
        let signature = run_one(target, &input).map_err(|m| failure(options, target, &input, &m, exec))?;
        exec += 1;
        execs.fetch_add(1, Ordering::Relaxed);
        if outcomes.insert(signature) {
            if pool.len() < seeds + MAX_POOL {
                pool.push(input);
            } else {
                let at = seeds + rng.below(MAX_POOL);
                pool[at] = input;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "fuzz {:<10} seed {} : {exec} execs + {seeds} corpus in {seconds:.1}s ({:.0}/s), {} distinct outcomes, pool {}",
        target.name,
        options.seed,
        exec as f64 / seconds.max(1e-9),
        outcomes.len(),
        pool.len()
    );
    execs.store(FINISHED, Ordering::Relaxed);
    Ok(())
}

pub fn fuzz(options: &Options) -> Result<(), String> {
    quiet_panics();
    let names: Vec<&str> = options.targets.iter().map(|t| t.name).collect();
    println!(
        "fuzz: seed {} (replay a run with --seed {} --execs N), targets {}, {:?} each",
        options.seed,
        options.seed,
        names.join(" "),
        options.budget.time
    );
    for target in &options.targets {
        fuzz_target(options, target)?;
    }
    Ok(())
}

pub fn replay(options: &Options, files: &[PathBuf]) -> Result<(), String> {
    let [target] = options.targets.as_slice() else {
        return Err("--replay needs exactly one --target".into());
    };
    quiet_panics();
    let mut failed = 0;
    for file in files {
        let input = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        match run_one(target, &input) {
            Ok(signature) => println!("{}: ok (outcome {signature:016x})", file.display()),
            Err(message) => {
                failed += 1;
                println!("{}: PANIC: {message}", file.display());
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of {} inputs failed", files.len()));
    }
    Ok(())
}

/// Generated inputs as corpus files (for the binary formats, whose seeds are not written by hand).
pub fn write_seeds(options: &Options, count: usize) -> Result<(), String> {
    for target in &options.targets {
        let dir = options.corpus.join(target.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut rng = Rng::new(options.seed ^ fnv(target.name.as_bytes()));
        for i in 0..count {
            let input = (target.generate)(&mut rng);
            let path = dir.join(format!("gen-{i:02}.bin"));
            std::fs::write(&path, input).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        println!("{}: {count} seeds in {}", target.name, dir.display());
    }
    Ok(())
}

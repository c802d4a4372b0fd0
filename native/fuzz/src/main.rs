//! `extproc-fuzz`: a seeded, structure-aware mutational fuzzer for the core crate's input surfaces, on
//! the stable toolchain (docs/reliability.md, "Fuzzing", says why this and not libFuzzer).
//!
//! For each target it runs the seed corpus (`corpus/<target>/`), then until its budget is spent runs
//! inputs that are generated from the target's format, changed structurally, or byte-mutated from the
//! pool (the corpus plus every input that ended a new way). A panic, a broken invariant or an input that
//! runs past `--timeout` writes the input under `--crashes` and exits 1 with its path. The same seed gives
//! the same inputs: `--seed S --execs N` replays a run, `--replay FILE` one input.

mod driver;
mod json_gen;
mod mutate;
mod rng;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use driver::{Budget, Options};

const USAGE: &str = "usage: extproc-fuzz [--target NAME]... [--seconds S] [--execs N] [--seed N] [--timeout S]
                    [--corpus DIR] [--crashes DIR] [--replay FILE]... [--write-seeds N] [--list]
  --seconds S      budget per target (default 10)
  --execs N        stop a target after N inputs (with --seed: replays a run exactly)
  --seed N         the run's seed (default: from the clock; printed either way)
  --timeout S      an input running longer counts as a hang (default 10)
  --replay FILE    run these inputs of the (one) --target and report, instead of fuzzing
  --write-seeds N  write N generated inputs per target into the corpus as gen-*.bin, then exit";

fn parse_args() -> Result<(Options, Vec<PathBuf>, Option<usize>), String> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut options = Options {
        targets: Vec::new(),
        budget: Budget {
            time: Duration::from_secs(10),
            execs: None,
        },
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_000),
        timeout: Duration::from_secs(10),
        corpus: manifest.join("corpus"),
        // native/target: the workspace's build directory, ignored by git.
        crashes: manifest.parent().unwrap_or(&manifest).join("target/fuzz-crashes"),
    };
    let mut replay = Vec::new();
    let mut write_seeds = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg} {v}: {e}"));
        match arg.as_str() {
            "--target" => {
                let name = value()?;
                let target = targets::by_name(&name).ok_or_else(|| format!("no target {name}"))?;
                options.targets.push(target);
            }
            "--seconds" => options.budget.time = Duration::from_secs_f64(value()?.parse().map_err(|e| format!("{e}"))?),
            "--execs" => options.budget.execs = Some(number(value()?)?),
            "--seed" => options.seed = number(value()?)?,
            "--timeout" => options.timeout = Duration::from_secs(number(value()?)?),
            "--corpus" => options.corpus = value()?.into(),
            "--crashes" => options.crashes = value()?.into(),
            "--replay" => replay.push(value()?.into()),
            "--write-seeds" => write_seeds = Some(number(value()?)? as usize),
            "--list" => {
                targets::TARGETS.iter().for_each(|t| println!("{}", t.name));
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if options.targets.is_empty() {
        options.targets = targets::TARGETS.iter().collect();
    }
    Ok((options, replay, write_seeds))
}

fn main() -> ExitCode {
    let (options, replay, write_seeds) = match parse_args() {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let result = if let Some(count) = write_seeds {
        driver::write_seeds(&options, count)
    } else if !replay.is_empty() {
        driver::replay(&options, &replay)
    } else {
        driver::fuzz(&options)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

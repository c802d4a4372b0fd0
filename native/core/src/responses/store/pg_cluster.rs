//! A throwaway PostgreSQL server for the store's tests: `initdb` into a temp directory, `postgres` on a
//! free port (its unix socket in that directory too), stopped and removed on drop, also when a test fails.
//!
//! The binaries come from Debian's `postgresql` package (`.ci/run` installs it) under
//! /usr/lib/postgresql/<version>/bin, or from `EXTPROC_PG_BIN`. Missing binaries fail the test: a skip would
//! hide a backend nobody ran. PostgreSQL refuses to run as root, so as root the server runs as `nobody`.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::conformance::TempDir;

pub struct PgCluster {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// (uid, gid) the server runs as when the tests run as root.
    run_as: Option<(u32, u32)>,
    server: Mutex<Option<Child>>,
}

fn find_binaries() -> PathBuf {
    if let Some(bin) = std::env::var_os("EXTPROC_PG_BIN") {
        return PathBuf::from(bin);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): install Debian's `postgresql` \
             package (`apt-get install -y postgresql`; .ci/run does) or set EXTPROC_PG_BIN"
        )
    })
}

/// `nobody`'s ids from /etc/passwd, when this process is root (PostgreSQL will not run as root).
fn unprivileged_ids() -> Option<(u32, u32)> {
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    if euid != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let ids = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"nobody") && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    });
    Some(ids.unwrap_or((65534, 65534)))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PgCluster {
    pub fn start() -> Self {
        let started = Instant::now();
        let bin = find_binaries();
        let dir = TempDir::new("pg");
        let run_as = unprivileged_ids();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let cluster = Self {
            dir,
            bin,
            port: free_port(),
            run_as,
            server: Mutex::new(None),
        };
        let initdb = cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.data())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output()
            .expect("running initdb");
        assert!(
            initdb.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&initdb.stdout),
            String::from_utf8_lossy(&initdb.stderr)
        );
        cluster.spawn_server();
        eprintln!("PostgreSQL test cluster up in {:?}", started.elapsed());
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command.current_dir(self.dir.path());
        command
    }

    fn spawn_server(&self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
            ])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=60"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting postgres");
        *self.server.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.admin().is_ok() {
                return;
            }
            if let Some(status) = self.server.lock().unwrap().as_mut().unwrap().try_wait().unwrap() {
                panic!("postgres exited ({status}): {}", self.log());
            }
            assert!(Instant::now() < deadline, "postgres did not come up: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn stop_server(&self) {
        let Some(mut child) = self.server.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        // SIGINT is the fast shutdown: sessions are ended, the server exits cleanly within a moment.
        let _ = Command::new("kill").arg("-INT").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the server and starts it again on the same port and data.
    pub fn restart(&self) {
        self.stop_server();
        self.spawn_server();
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn admin(&self) -> Result<postgres::Client, postgres::Error> {
        postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
    }

    /// Creates an empty database and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let mut admin = self.admin().expect("the admin connection");
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        self.url(name)
    }

    pub fn execute(&self, database: &str, sql: &str) {
        let mut client = postgres::Client::connect(&self.url(database), postgres::NoTls).unwrap();
        client.batch_execute(sql).unwrap();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop_server();
    }
}

//! A throwaway PostgreSQL cluster from the machine's own binaries, for `inbox dev`
//! and for tests that must stop a database. PostgreSQL refuses to run as root,
//! so as root the cluster belongs to, and runs as, an unprivileged user.

use std::{
    ffi::{CString, OsStr},
    net::TcpListener,
    path::PathBuf,
    process::Stdio,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use tokio::process::Command;

/// A throwaway PostgreSQL cluster on a free loopback port, its files in a
/// temporary folder removed when it is dropped ([`EmbeddedPostgres::destroy`]
/// says if that failed): what `inbox dev` runs on without a `DATABASE_URL`,
/// and what a test starts to stop, crash and resume a database under a stage.
/// It needs the PostgreSQL binaries (see [`postgres_bin_dir`](super::postgres_bin_dir)).
pub struct EmbeddedPostgres {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as: Option<String>,
    running: bool,
}

impl EmbeddedPostgres {
    /// Creates a cluster in a new temporary folder and starts it on a free loopback port.
    pub async fn start() -> Result<Self> {
        let bin = find_bin_dir()?;
        let run_as = if unsafe { libc::geteuid() } == 0 { Some(unprivileged_user()?) } else { None };
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let root = std::env::temp_dir().join(format!("inbox-pg-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&root).with_context(|| format!("creating {}", root.display()))?;
        let mut pg = EmbeddedPostgres { root, bin, port: free_port()?, run_as, running: false };
        if let Some(user) = &pg.run_as {
            let (uid, gid) = user_ids(user)?;
            std::os::unix::fs::chown(&pg.root, Some(uid), Some(gid))
                .context("handing the cluster folder to its user")?;
        }
        let data = pg.data_dir();
        pg.run(
            "initdb",
            &[OsStr::new("-D"), data.as_os_str()],
            &["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions"],
        )
        .await?;
        // The port was free when asked for; another process may have taken it
        // since (tests start clusters side by side): then another one.
        let mut attempt = 1;
        loop {
            match pg.resume().await {
                Err(e) if attempt < 3 && pg.log_tail().contains("Address already in use") => {
                    tracing::warn!("PostgreSQL's port {} was taken meanwhile: another ({e:#})", pg.port);
                    pg.port = free_port()?;
                    attempt += 1;
                }
                done => break done?,
            }
        }
        Ok(pg)
    }

    /// Its URL, as the superuser `postgres` (trust authentication, loopback only).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// Starts the (stopped) cluster again on the same port.
    pub async fn resume(&mut self) -> Result<()> {
        let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1", self.port, self.root.display());
        let (data, log) = (self.data_dir(), self.root.join("postgres.log"));
        self.run(
            "pg_ctl",
            &[
                OsStr::new("-D"),
                data.as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&opts),
            ],
            &["-w", "-t", "60", "-s", "start"],
        )
        .await
        .with_context(|| {
            format!("starting PostgreSQL; the end of its log ({}):\n{}", log.display(), self.log_tail())
        })?;
        self.running = true;
        Ok(())
    }

    /// The last lines of the server's log (the folder goes with the cluster, so an error carries them).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.root.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Stops the cluster (fast shutdown), keeping its files.
    pub async fn pause(&mut self) -> Result<()> {
        let data = self.data_dir();
        self.run("pg_ctl", &[OsStr::new("-D"), data.as_os_str()], &["-w", "-s", "-m", "fast", "stop"]).await?;
        self.running = false;
        Ok(())
    }

    /// Stops the cluster as a crash would (immediate shutdown: no checkpoint,
    /// connections cut), keeping its files; [`EmbeddedPostgres::resume`]
    /// recovers it from the WAL.
    pub async fn crash(&mut self) -> Result<()> {
        let data = self.data_dir();
        self.run("pg_ctl", &[OsStr::new("-D"), data.as_os_str()], &["-w", "-s", "-m", "immediate", "stop"]).await?;
        self.running = false;
        Ok(())
    }

    /// Stops the cluster and deletes its files.
    pub async fn destroy(mut self) -> Result<()> {
        if self.running {
            self.pause().await?;
        }
        std::fs::remove_dir_all(&self.root).with_context(|| format!("removing {}", self.root.display()))
    }

    async fn run(&self, program: &str, paths: &[&OsStr], args: &[&str]) -> Result<()> {
        let exe = self.bin.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(paths).args(args).current_dir(&self.root).stdin(Stdio::null());
        let out = cmd.output().await.with_context(|| format!("running {}", exe.display()))?;
        if !out.status.success() {
            bail!("{program} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }
}

impl Drop for EmbeddedPostgres {
    /// A cluster is never left behind, even on a panic: immediate stop, then the files go.
    fn drop(&mut self) {
        if self.running {
            let exe = self.bin.join("pg_ctl");
            let mut cmd = match &self.run_as {
                Some(user) => {
                    let mut c = std::process::Command::new("runuser");
                    c.args(["-u", user, "--"]).arg(&exe);
                    c
                }
                None => std::process::Command::new(&exe),
            };
            let _ = cmd
                .arg("-D")
                .arg(self.data_dir())
                .args(["-w", "-s", "-m", "immediate", "stop"])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `INBOX_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin`, else the folder of `initdb` on `PATH`.
pub(super) fn find_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("INBOX_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH").iter().flat_map(std::env::split_paths).find(|dir| dir.join("initdb").exists()).context(
        "no PostgreSQL binaries found: install PostgreSQL, or set INBOX_PG_BIN to the folder holding initdb and pg_ctl",
    )
}

/// `INBOX_PG_USER`, else `postgres`, else `nobody`.
fn unprivileged_user() -> Result<String> {
    let candidates =
        std::env::var("INBOX_PG_USER").map(|u| vec![u]).unwrap_or_else(|_| vec!["postgres".into(), "nobody".into()]);
    candidates.into_iter().find(|u| user_ids(u).is_ok()).context(
        "running as root, and no unprivileged user (postgres or nobody) exists to run PostgreSQL; set INBOX_PG_USER",
    )
}

fn user_ids(user: &str) -> Result<(u32, u32)> {
    let name = CString::new(user)?;
    // SAFETY: getpwnam returns a pointer into static storage, read at once, before any other call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("no user {user}");
    }
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((uid, gid))
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("finding a free port")?.local_addr()?.port())
}

//! A throwaway PgBouncer in front of the test server (Debian's package;
//! `scripts/test` installs it when missing).

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl PgBouncer {
    /// `mode` (`session` or `transaction`) pooling with at most
    /// `server_connections` server connections per database and user, handed
    /// out in turn (`server_round_robin`) so that a client's consecutive
    /// transactions land on different servers whenever more than one is idle.
    pub fn start(upstream_host: &str, upstream_port: u16, server_connections: u32, mode: &str) -> PgBouncer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("inbox-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n* = host={upstream_host} port={upstream_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = {mode}\nserver_round_robin = 1\n\
             default_pool_size = {server_connections}\nmax_client_conn = 500\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        // PgBouncer refuses to run as root: it drops to postgres, which must be able to write its log.
        if unsafe { libc_geteuid() } == 0 {
            Command::new("chmod").args(["-R", "a+rwX"]).arg(&dir).status().unwrap();
        }
        let child = spawn(&dir, port);
        PgBouncer { child, dir, port }
    }

    /// Killed with SIGKILL (every client and server connection cut) and started again on the same port.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // As a supervisor would: a killed PgBouncer leaves its pidfile, and refuses to start over one.
        let _ = std::fs::remove_file(self.dir.join("pgbouncer.pid"));
        self.child = spawn(&self.dir, self.port);
    }

    /// The log, to check for errors it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

/// Starts PgBouncer on the configuration in `dir` and waits until it listens on `port`.
fn spawn(dir: &Path, port: u16) -> Child {
    let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("pgbouncer");
    let mut cmd = Command::new(binary);
    if unsafe { libc_geteuid() } == 0 {
        cmd.args(["-u", "postgres"]);
    }
    let mut child = cmd
        .arg(dir.join("pgbouncer.ini"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgbouncer is not installed: `apt-get install pgbouncer` (scripts/test does)");
    for _ in 0..200 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() && child.try_wait().is_ok_and(|exited| exited.is_none()) {
            return child;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default();
    panic!("pgbouncer did not listen on {port}:\n{log}");
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

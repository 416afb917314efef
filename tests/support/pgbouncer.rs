//! A throwaway PgBouncer in session pooling mode in front of the test server
//! (Debian's package; `scripts/test` installs it when missing).

use std::{
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl PgBouncer {
    /// Session pooling with at most `server_connections` server connections
    /// per database and user.
    pub fn start(upstream_host: &str, upstream_port: u16, server_connections: u32) -> PgBouncer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("inbox-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n* = host={upstream_host} port={upstream_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = session\n\
             default_pool_size = {server_connections}\nmax_client_conn = 500\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut cmd = Command::new(binary);
        // PgBouncer refuses to run as root: it drops to postgres, which must be able to write its log.
        if unsafe { libc_geteuid() } == 0 {
            Command::new("chmod").args(["-R", "a+rwX"]).arg(&dir).status().unwrap();
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pgbouncer is not installed: `apt-get install pgbouncer` (scripts/test does)");
        let bouncer = PgBouncer { child, dir, port };
        for _ in 0..200 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return bouncer;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let log = std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default();
        panic!("pgbouncer did not listen on {port}:\n{log}");
    }

    /// The log, to check for errors it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
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

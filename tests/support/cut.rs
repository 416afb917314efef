//! A TCP proxy to PostgreSQL that cuts one connection right after a chosen
//! statement reached the server: the statement runs (and, outside a
//! transaction, commits), its answer never comes back.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use sqlx::{postgres::PgPoolOptions, PgPool};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    task::JoinHandle,
};

pub struct CutOnce {
    /// A pool to the same database, through the proxy.
    pub pool: PgPool,
    cuts: Arc<AtomicUsize>,
}

impl CutOnce {
    /// A proxy in front of `pool`'s server that cuts the first connection to
    /// send a statement whose text contains `needle`, once the server has the
    /// message that runs it (a simple query, or the Sync after its Execute).
    pub async fn start(pool: &PgPool, needle: &str) -> CutOnce {
        let options = pool.connect_options();
        let target = (options.get_host().to_string(), options.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cuts = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (needle, counted) = (needle.as_bytes().to_vec(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target.clone()).await else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                tokio::spawn(forward(client, server, needle.clone(), done.clone(), counted.clone()));
            }
        });
        let through = (*options).clone().host("127.0.0.1").port(port).ssl_mode(sqlx::postgres::PgSslMode::Disable);
        let pool = PgPoolOptions::new().max_connections(4).connect_with(through).await.unwrap();
        CutOnce { pool, cuts }
    }

    /// How many connections were cut (0 or 1).
    pub fn cut(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

async fn forward(client: TcpStream, server: TcpStream, needle: Vec<u8>, done: Arc<AtomicBool>, cuts: Arc<AtomicUsize>) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let back = tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
    // The statement with the needle was parsed on this connection, and then executed.
    let (mut parsed, mut executed) = (false, false);
    let cut = |tag: u8, body: &[u8]| {
        let has_needle = body.windows(needle.len()).any(|w| w == needle);
        match tag {
            b'P' => parsed = has_needle,
            b'E' => executed = parsed,
            _ => {}
        }
        let runs = (tag == b'Q' && has_needle) || (tag == b'S' && executed);
        let cutting = runs && !done.swap(true, Ordering::SeqCst);
        if cutting {
            cuts.fetch_add(1, Ordering::SeqCst);
        }
        cutting
    };
    forward_until(client_read, server_write, back, cut, Duration::from_millis(50)).await;
}

/// Forwards a client's messages to the server until `cut(tag, body)` says
/// to cut after one: then `back` (what forwards the server's answers) is
/// stopped, so the client hears nothing more, and the server gets `pause` to
/// run what it has before its connection closes. The client
/// must not ask for TLS (`sslmode=disable`): its first message is the startup
/// message, untyped, and every later one has a type byte.
pub async fn forward_until<T>(
    mut client: OwnedReadHalf,
    mut server: OwnedWriteHalf,
    back: JoinHandle<T>,
    mut cut: impl FnMut(u8, &[u8]) -> bool,
    pause: Duration,
) {
    let mut typed = false;
    let cutting = loop {
        let mut head = vec![0u8; if typed { 5 } else { 4 }];
        if client.read_exact(&mut head).await.is_err() {
            break false;
        }
        let len = u32::from_be_bytes(head[head.len() - 4..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if client.read_exact(&mut body).await.is_err() || server.write_all(&[&head[..], &body].concat()).await.is_err()
        {
            break false;
        }
        if typed && cut(head[0], &body) {
            break true;
        }
        typed = true;
    };
    back.abort();
    if cutting {
        let _ = server.flush().await;
        tokio::time::sleep(pause).await;
    }
}

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
    net::{TcpListener, TcpStream},
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
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let back = tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
    // The startup message has no type byte; every later one has.
    let mut typed = false;
    // The statement with the needle was parsed on this connection, and then executed.
    let (mut parsed, mut executed) = (false, false);
    loop {
        let mut head = vec![0u8; if typed { 5 } else { 4 }];
        if client_read.read_exact(&mut head).await.is_err() {
            break;
        }
        let len = u32::from_be_bytes(head[head.len() - 4..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if client_read.read_exact(&mut body).await.is_err()
            || server_write.write_all(&[&head[..], &body].concat()).await.is_err()
        {
            break;
        }
        if !typed {
            typed = true;
            continue;
        }
        let has_needle = body.windows(needle.len()).any(|w| w == needle);
        match head[0] {
            b'P' => parsed = has_needle,
            b'E' => executed = parsed,
            _ => {}
        }
        let runs = (head[0] == b'Q' && has_needle) || (head[0] == b'S' && executed);
        if runs && !done.swap(true, Ordering::SeqCst) {
            cuts.fetch_add(1, Ordering::SeqCst);
            // The client hears nothing more; the server has the statement and runs it.
            back.abort();
            let _ = server_write.flush().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        }
    }
    back.abort();
}

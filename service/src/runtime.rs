//! What a long-running server of this crate does at its start and its end.

/// Completes at Ctrl-C or SIGTERM: when a long-running server (`inbox dev`, `inbox console`) stops.
pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Pins glibc's threshold for serving an allocation with its own `mmap` at
/// its default, 128 KiB, in a long-running server (`inbox dev`, `inbox
/// console`). glibc otherwise raises it to the size of the largest such block
/// freed (up to 32 MiB): once the console has hashed a password (Argon2id
/// works in 19 MiB), request bodies of 1 MiB would come from the heap, whose
/// freed memory stays with the process, instead of being mapped and given
/// back to the system as each delivery ends (`inbox/tests/dev.rs`
/// measures it).
pub(crate) fn keep_large_allocations_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of glibc's allocator, under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// A line on stdout (what a server says to the terminal that started it); a
/// closed stdout (`inbox dev | head`) is no panic.
pub(crate) fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

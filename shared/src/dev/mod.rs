//! The local tooling behind `inbox dev` and `inbox demo`: the HTTP server, a
//! throwaway PostgreSQL, and the storm of signed deliveries with its checks.

pub mod embedded_pg;
pub mod server;
pub mod storm;

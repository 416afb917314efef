//! The local tooling behind `inbox dev`: the HTTP server and a throwaway PostgreSQL.

pub mod embedded_pg;
pub mod server;

//! The worker and the reference domain against a real PostgreSQL.

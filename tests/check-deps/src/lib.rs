//! No code: the package's `Cargo.toml` gives the test command's checks of each
//! package alone one feature set of their dependencies (see there).

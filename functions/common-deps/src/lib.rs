//! No code: the package's `Cargo.toml` gives the Lambda functions one feature
//! set of the dependencies they share, so that their separate builds compile
//! those once (see there).

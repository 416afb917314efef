// Empty: it is here so that the package's [build-dependencies] (syn and
// friends, with the features the checked packages' proc macros share) are
// part of each check, compiled for the machine that builds.
fn main() {}

// Empty: it is here so that the package's [build-dependencies] (syn and
// displaydoc, with the features the functions' proc macros share) are part
// of each function's build, compiled for the machine that builds.
fn main() {}

//! sqlx's `migrate!` embeds the files it finds when it runs: a new migration
//! must rebuild the crate, or it would be missing from the Migrator.
fn main() {
    println!("cargo:rerun-if-changed=.");
    println!("cargo:rerun-if-changed=optional");
}

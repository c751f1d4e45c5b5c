//! `cms-bookie` binary.
fn main() {
    eprintln!("cms-bookie: being built");
    std::process::exit(1);
}

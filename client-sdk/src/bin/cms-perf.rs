//! `cms-perf` load generator: not built yet; it says so and exits non-zero.

fn main() {
    eprintln!("cms-perf: the load generator is not built yet (it needs the broker and the SDK)");
    std::process::exit(1);
}

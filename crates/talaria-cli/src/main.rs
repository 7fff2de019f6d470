//! The `talaria` command.
#![forbid(unsafe_code)]

fn main() {
    println!("talaria");
}

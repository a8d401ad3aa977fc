fn main() {
    println!("hcp-dr {}", env!("CARGO_PKG_VERSION"));
}

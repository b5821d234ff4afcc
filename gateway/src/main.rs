fn main() {
    println!("kubetun-gateway: not yet implemented");
}

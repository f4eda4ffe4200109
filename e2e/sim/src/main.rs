fn main() {
    eprintln!("podha-sim: not built yet");
    std::process::exit(1);
}

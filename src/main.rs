use clap::Parser;

fn main() {
    let config = quiver::config::Config::parse();
    if let Err(error) = quiver::server::run(config) {
        eprintln!("quiver: {error}");
        std::process::exit(1);
    }
}

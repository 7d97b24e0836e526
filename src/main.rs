use clap::Parser;

fn main() {
    let config = quiver::config::Config::parse();
    quiver::log::set_level(config.log_level);
    if let Err(error) = quiver::server::run(config) {
        quiver::log::error(format_args!("{error}"));
        std::process::exit(1);
    }
}

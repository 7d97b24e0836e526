fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(status) = quiver::tools::run(&args) {
        std::process::exit(status);
    }
    // `quiver serve` is `quiver`.
    if args.get(1).is_some_and(|arg| arg == "serve") {
        args.remove(1);
    }
    let config = match quiver::config::Config::load(args) {
        Ok(config) => config,
        Err(quiver::config::ConfigError::Flags(error)) => error.exit(),
        Err(quiver::config::ConfigError::File(error)) => {
            eprintln!("quiver: error: {error}");
            std::process::exit(2);
        }
    };
    quiver::log::set_level(config.log_level);
    quiver::log::set_format(config.log_format);
    if let Err(error) = quiver::server::run(config) {
        quiver::log::error("stopped", format_args!("{error}"));
        std::process::exit(1);
    }
}

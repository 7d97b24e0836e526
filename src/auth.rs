//! The API key: where it comes from, where it is kept, how it is checked.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::files;

pub const KEY_FILE: &str = "api_key.txt";

/// Bytes of randomness in a generated key (written as twice as many hex digits).
const GENERATED_KEY_BYTES: usize = 32;

/// Where the key in use came from, for the start-up log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    Flag,
    KeyFile,
    Generated,
}

/// Picks the key (flag or environment, else the key file, else a new random
/// one) and writes it to the key file with mode 0600.
/// Whether a key is given, or kept in the data directory's key file.
pub fn has_key(data_dir: &Path, given: Option<&str>) -> bool {
    given.is_some_and(|key| !key.trim().is_empty())
        || fs::read_to_string(data_dir.join(KEY_FILE)).is_ok_and(|text| !text.trim().is_empty())
}

pub fn load_or_create(data_dir: &Path, given: Option<&str>) -> io::Result<(String, KeySource)> {
    let path = data_dir.join(KEY_FILE);
    let (key, source) = match given.map(str::trim).filter(|k| !k.is_empty()) {
        Some(key) => (key.to_owned(), KeySource::Flag),
        None => match fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => (text.trim().to_owned(), KeySource::KeyFile),
            Ok(_) => (generate()?, KeySource::Generated),
            Err(error) if error.kind() == io::ErrorKind::NotFound => (generate()?, KeySource::Generated),
            Err(error) => return Err(error),
        },
    };
    if key.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the API key must be printable ASCII without spaces"));
    }
    write_key_file(&path, &key)?;
    Ok((key, source))
}

/// The read-only key, if one is given: printable ASCII like the key, and
/// not the key itself (which would make every request read-only or none).
pub fn read_only_key(given: Option<&str>, key: &str) -> io::Result<Option<String>> {
    let Some(given) = given.map(str::trim).filter(|k| !k.is_empty()) else { return Ok(None) };
    let refuse = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("--read-only-api-key: {why}"));
    if given.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err(refuse("it must be printable ASCII without spaces"));
    }
    if given == key {
        return Err(refuse("it is the API key itself; give a key of its own"));
    }
    Ok(Some(given.to_owned()))
}

fn write_key_file(path: &Path, key: &str) -> io::Result<()> {
    files::write_atomically(path, |file| {
        // Readable by the owner alone before the key is in it.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(key.as_bytes())?;
        file.write_all(b"\n")
    })?;
    files::sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn generate() -> io::Result<String> {
    let mut bytes = [0u8; GENERATED_KEY_BYTES];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length describe the unfilled part of `bytes`.
        let n = unsafe { libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the start-up log shows of the key: its first characters (a quarter
/// of it, at most 4) and its length, enough to tell which key is in use
/// without giving it away to whoever reads the logs. A generated key (64
/// hex digits) keeps 240 of its 256 bits unseen.
pub fn fingerprint(key: &str) -> String {
    let shown: String = key.chars().take((key.chars().count() / 4).min(4)).collect();
    format!("{shown}… ({} characters)", key.chars().count())
}

/// The outcome of checking a request's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyCheck {
    Ok,
    Missing,
    Wrong,
}

/// Compares in time independent of where the keys differ.
pub fn check(expected: &[u8], given: &[u8]) -> KeyCheck {
    if given.is_empty() {
        KeyCheck::Missing
    } else if constant_time_eq::constant_time_eq(expected, given) {
        KeyCheck::Ok
    } else {
        KeyCheck::Wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_long_random_hex() {
        let (a, b) = (generate().unwrap(), generate().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn fingerprints_show_at_most_a_quarter_of_the_key() {
        assert_eq!(fingerprint("3f9c0123456789abcdef0123456789e1"), "3f9c… (32 characters)");
        assert_eq!(fingerprint("from-flag"), "fr… (9 characters)");
        assert_eq!(fingerprint("abc"), "… (3 characters)");
    }

    #[test]
    fn check_outcomes() {
        assert_eq!(check(b"abc", b""), KeyCheck::Missing);
        assert_eq!(check(b"abc", b"abd"), KeyCheck::Wrong);
        assert_eq!(check(b"abc", b"abcd"), KeyCheck::Wrong);
        assert_eq!(check(b"abc", b"abc"), KeyCheck::Ok);
    }
}

//! The node's WireGuard key: generated on first start, kept in the state directory (mode 0600,
//! written atomically), loaded on every later start. It never leaves the node: states carry only
//! public keys, and the executor reports its own public key.

use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroize as _;

/// The key file's name in the state directory: `wg genkey`'s format (base64 and a newline), so
/// `wg pubkey < FILE` prints the node's public key.
pub const KEY_FILE: &str = "wireguard.key";

/// A key's length in bytes (WG_KEY_LEN).
pub const KEY_LEN: usize = 32;

/// What loading, making or parsing a key met.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("WireGuard key file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file is there but holds no key: never replaced silently (the node's identity would
    /// change under its peers).
    #[error("WireGuard key file {} is malformed: {reason} (move it away to make a new key)", path.display())]
    Malformed { path: PathBuf, reason: String },
    #[error("no randomness for a WireGuard key: {0}")]
    Random(String),
    /// A public key in a state or an answer that is not 32 bytes of base64.
    #[error("{0:?} is not a WireGuard key (32 bytes of base64, 44 characters)")]
    Invalid(String),
}

/// A Curve25519 private key, clamped as WireGuard clamps it. Wiped on drop; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey([u8; KEY_LEN]);

impl Drop for PrivateKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey(public {})", self.public())
    }
}

impl PrivateKey {
    /// A fresh key from the OS's randomness (getrandom(2)), clamped like `wg genkey`.
    pub fn generate() -> Result<Self, KeyError> {
        let mut k = [0u8; KEY_LEN];
        getrandom::fill(&mut k).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(PrivateKey::from_bytes(clamp(k)))
    }

    /// The key as given (WireGuard clamps it on use, as [`PrivateKey::public`] does).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        PrivateKey(bytes)
    }

    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The public key: X25519 of the clamped key and the base point, as `wg pubkey` computes it.
    pub fn public(&self) -> PublicKey {
        PublicKey(x25519_dalek::x25519(self.0, x25519_dalek::X25519_BASEPOINT_BYTES))
    }

    fn parse(text: &str) -> Option<Self> {
        decode(text.trim_end_matches('\n')).map(PrivateKey)
    }

    fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }
}

/// WireGuard's clamping of a Curve25519 scalar (as `wg genkey` and the kernel do).
fn clamp(mut k: [u8; KEY_LEN]) -> [u8; KEY_LEN] {
    k[0] &= 248;
    k[31] = (k[31] & 127) | 64;
    k
}

fn decode(text: &str) -> Option<[u8; KEY_LEN]> {
    if text.len() != 44 {
        return None;
    }
    let bytes = STANDARD.decode(text).ok()?;
    bytes.try_into().ok()
}

/// A public key; shown and parsed as base64 (44 characters), as `wg` shows it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl PublicKey {
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode(s).map(PublicKey).ok_or_else(|| KeyError::Invalid(s.to_string()))
    }
}

/// The node's key in `dir`: loaded from [`KEY_FILE`] when it is there, else generated and
/// written (mode 0600, atomically: a temporary file in `dir`, synced, renamed over, the
/// directory synced), so a crash leaves either no key or the whole key. A file that does not
/// hold a key is an error naming it, never replaced. A key file others may read is tightened
/// to 0600.
pub fn load_or_create(dir: &Path) -> Result<PrivateKey, KeyError> {
    let path = dir.join(KEY_FILE);
    let io = |source| KeyError::Io { path: path.clone(), source };
    match fs::read_to_string(&path) {
        Ok(mut text) => {
            let key = PrivateKey::parse(&text);
            text.zeroize();
            let key = key.ok_or_else(|| KeyError::Malformed {
                path: path.clone(),
                reason: "expected one line of 32 bytes in base64, as `wg genkey` writes".into(),
            })?;
            let mode = fs::metadata(&path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "WireGuard key file readable by others; tightening to 0600");
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(io)?;
            }
            Ok(key)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let key = PrivateKey::generate()?;
            write_atomically(dir, &path, &key).map_err(io)?;
            tracing::info!(path = %path.display(), public_key = %key.public(), "generated the node's WireGuard key");
            Ok(key)
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            Err(KeyError::Malformed { path: path.clone(), reason: "not text".into() })
        }
        Err(e) => Err(io(e)),
    }
}

fn write_atomically(dir: &Path, path: &Path, key: &PrivateKey) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{KEY_FILE}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        let mut text = key.to_base64();
        text.push('\n');
        let written = f.write_all(text.as_bytes());
        text.zeroize();
        written?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From `wg genkey | tee k | wg pubkey` (wireguard-tools v1.0.20210914).
    const PRIVATE: &str = "CFR+TXgKuS/tS1A44h0FaI7/YEhmo/7+cutoTFYi4Uk=";
    const PUBLIC: &str = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kuport-key-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_public_key_is_what_wg_pubkey_prints() {
        let key = PrivateKey::parse(PRIVATE).expect("key");
        assert_eq!(key.public().to_string(), PUBLIC);
        // `echo oA8H... | wg pubkey`: wg clamps an unclamped key, and so does x25519.
        let unclamped = PrivateKey::parse("oA8HZlCzN1u3fLsdP0EmoD93YnVHCDFWgvq1CRPEIlM=").expect("key");
        assert_eq!(unclamped.public().to_string(), "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg=");
        assert_eq!(PUBLIC.parse::<PublicKey>().expect("public").to_string(), PUBLIC);
        assert!(format!("{key:?}").contains(PUBLIC) && !format!("{key:?}").contains(PRIVATE));
    }

    #[test]
    fn generated_keys_are_clamped_and_distinct() {
        let (a, b) = (PrivateKey::generate().expect("key"), PrivateKey::generate().expect("key"));
        assert_ne!(a, b);
        assert_eq!(a.bytes()[0] & 7, 0);
        assert_eq!(a.bytes()[31] & 0xc0, 0x40);
        assert_eq!(a.public().to_string().len(), 44);
    }

    #[test]
    fn a_key_is_made_once_kept_0600_and_reloaded() {
        let dir = temp_dir("keep");
        let made = load_or_create(&dir).expect("made");
        let path = dir.join(KEY_FILE);
        let meta = fs::metadata(&path).expect("file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = fs::read_to_string(&path).expect("read");
        assert_eq!(text.len(), 45, "base64 and a newline, like wg genkey");
        assert_eq!(load_or_create(&dir).expect("loaded"), made);
        assert!(fs::read_dir(&dir).expect("dir").count() == 1, "no temporary file left");
        // Widened by hand: tightened again, same key.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(load_or_create(&dir).expect("loaded"), made);
        assert_eq!(fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        // Deleted: a new key.
        fs::remove_file(&path).expect("rm");
        assert_ne!(load_or_create(&dir).expect("new"), made);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_malformed_key_file_is_an_error_naming_it_and_stays() {
        let dir = temp_dir("bad");
        fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(KEY_FILE);
        for bad in ["not a key\n", "CFR+TXgKuS/tS1A44h0FaI7/YEhmo/7+cutoTFYi4U=\n", ""] {
            fs::write(&path, bad).expect("write");
            let e = load_or_create(&dir).expect_err("malformed").to_string();
            assert!(e.contains(&path.display().to_string()) && e.contains("malformed"), "{e}");
            assert_eq!(fs::read_to_string(&path).expect("kept"), bad);
        }
        fs::write(&path, format!("{PRIVATE}\n")).expect("write");
        assert_eq!(load_or_create(&dir).expect("key").public().to_string(), PUBLIC);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn public_keys_parse_strictly() {
        for bad in
            ["", "abc", "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU", "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfi==="]
        {
            assert!(bad.parse::<PublicKey>().is_err(), "{bad}");
        }
        // PUBLIC with a trailing bit set (`V` for `U`): a lenient decoder reads the same key.
        // Refused, so a key has one text, and a device's peers, a map by that text, hold each
        // key once (docs/overlay/node.md).
        let trailing = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiV=";
        assert!(trailing.parse::<PublicKey>().is_err(), "{trailing}");
    }
}

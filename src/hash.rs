//! SHA-256 in lowercase hex, the one digest every key and ledger field uses.

use sha2::{Digest, Sha256};

/// Lowercase hex of any byte string.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.extend_from_slice(&[DIGITS[(byte >> 4) as usize], DIGITS[(byte & 15) as usize]]);
    }
    // Hex digits are ASCII: never empty for want of UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// SHA-256 of `data`, in lowercase hex.
pub(crate) fn sha256(data: impl AsRef<[u8]>) -> String {
    hex(&Sha256::digest(data.as_ref()))
}

/// The 32 bytes a SHA-256 in hex spells (either case), if it is one.
pub(crate) fn from_hex(text: &[u8]) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, pair) in text.chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// A SHA-256 key as its 32 bytes: they sort as its lowercase hex does. A key that is not a
/// SHA-256 in hex (none that gacc makes) is taken by its own SHA-256.
pub(crate) fn key_bytes(key: &str) -> [u8; 32] {
    from_hex(key.as_bytes()).unwrap_or_else(|| Sha256::digest(key.as_bytes()).into())
}

/// Hashes 32-byte keys that are already SHA-256 digests by their first 8 bytes: uniform by
/// construction, so there is nothing to mix.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // A slice's length comes first (8 bytes), then the digest itself.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
            if bytes.len() >= 8 {
                break;
            }
        }
    }
}

/// A `HashMap` of digests, hashed by [`DigestHasher`].
pub(crate) type DigestMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<DigestHasher>>;

#[cfg(test)]
mod tests {
    #[test]
    fn digests_round_trip_and_sort_as_their_hex() {
        let (a, b) = (super::sha256("a"), super::sha256("b"));
        assert_eq!(super::hex(&super::key_bytes(&a)), a);
        assert_eq!(a.cmp(&b), super::key_bytes(&a).cmp(&super::key_bytes(&b)));
        assert_eq!(super::from_hex(b"00"), None);
        assert_eq!(super::from_hex(&[b'g'; 64]), None);
    }

    #[test]
    fn sha256_of_empty_string() {
        assert_eq!(
            super::sha256(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

//! SHA-256 in lowercase hex, the one digest every key and ledger field uses.

use sha2::{Digest, Sha256};

/// Lowercase hex of any byte string.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 15) as usize] as char);
    }
    out
}

/// SHA-256 of `data`, in lowercase hex.
pub(crate) fn sha256(data: impl AsRef<[u8]>) -> String {
    hex(&Sha256::digest(data.as_ref()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_empty_string() {
        assert_eq!(
            super::sha256(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

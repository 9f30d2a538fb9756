//! Per-image content hashes: blake3 over the encoded bytes as received, which is what vLLM's gRPC
//! proto carries ("Per-image blake3 hex hashes") for its multimodal cache.

/// blake3 of the encoded image bytes (before decoding: two clients sending the same file share a
/// hash, the same picture re-encoded does not).
pub fn content_hash(encoded: &[u8]) -> [u8; 32] {
    *blake3::hash(encoded).as_bytes()
}

/// Lower-case hex, 64 characters.
pub fn hash_hex(hash: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for byte in hash {
        hex.push(DIGITS[usize::from(byte >> 4)] as char);
        hex.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    hex
}

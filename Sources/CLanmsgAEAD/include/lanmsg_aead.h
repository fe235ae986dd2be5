// ChaCha20-Poly1305 (RFC 8439) for the Noise transport, in place: OpenSSL 3's EVP interface seals
// from and opens into the caller's buffers, without the intermediate copies and allocations of an
// API that returns new buffers (docs/PERFORMANCE.md, "Encryption"). No primitive is written here:
// this file only calls libcrypto (Debian: libssl-dev).
#ifndef LANMSG_AEAD_H
#define LANMSG_AEAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// A run of bytes.
typedef struct {
    const uint8_t *base;
    size_t length;
} lanmsg_span;

/// A run of writable bytes.
typedef struct {
    uint8_t *base;
    size_t length;
} lanmsg_mutable_span;

/// Seals the concatenation of `count` spans: ChaCha20-Poly1305 with the 32-byte `key`, the nonce
/// 32 zero bits || `counter` little-endian (Noise, section 12.3) and the associated data `ad`.
/// Writes the ciphertext (as long as the plaintext) and then the 16-byte tag to `out`.
/// Returns 0, or -1 when libcrypto fails (out of memory).
int lanmsg_chachapoly_seal(const uint8_t *key, uint64_t counter, const uint8_t *ad, size_t ad_length,
                           const lanmsg_span *spans, int count, uint8_t *out);

/// Opens `length` bytes of ciphertext followed by their 16-byte tag (`in` holds length + 16 bytes),
/// writing the plaintext into the `count` output spans in order (their lengths add up to `length`).
/// Returns 0 when the tag is right, -1 otherwise; on -1 the spans hold unauthenticated bytes that
/// must not be used.
int lanmsg_chachapoly_open(const uint8_t *key, uint64_t counter, const uint8_t *ad, size_t ad_length,
                           const uint8_t *in, size_t length, const lanmsg_mutable_span *spans, int count);

/// Noise's HKDF with SHA-256 (section 4.3): `outputs` (2 or 3) blocks of 32 bytes into `out`, from
/// the 32-byte chaining key and `ikm` (HMAC-SHA256 from libcrypto, no allocation).
/// Returns 0, or -1 when libcrypto fails.
int lanmsg_noise_hkdf(const uint8_t *chaining_key, const uint8_t *ikm, size_t ikm_length, int outputs, uint8_t *out);

/// Overwrites `length` bytes at `pointer` with zeros in a way the compiler cannot remove
/// (OPENSSL_cleanse): for keys that are no longer needed.
void lanmsg_wipe(void *pointer, size_t length);

#ifdef __cplusplus
}
#endif

#endif

#include "lanmsg_aead.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <pthread.h>
#include <string.h>

// One cipher context per thread and direction, made on first use and freed when the thread ends:
// a connection keeps only its 32-byte keys, and a message costs one re-initialisation (ChaCha20
// has no key schedule; Poly1305's key comes from each nonce anyway).
static EVP_CIPHER *cipher;
static EVP_MAC *hmac;
static pthread_key_t context_key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

typedef struct {
    EVP_CIPHER_CTX *seal;
    EVP_CIPHER_CTX *open;
    EVP_MAC_CTX *hmac;  // HMAC-SHA256 for Noise's HKDF: fetched once, not per call (HMAC() fetches every time)
} contexts;

static void free_contexts(void *value) {
    contexts *c = value;
    EVP_CIPHER_CTX_free(c->seal);
    EVP_CIPHER_CTX_free(c->open);
    EVP_MAC_CTX_free(c->hmac);
    OPENSSL_free(c);
}

static void setup(void) {
    // No clean-up at exit: OpenSSL's atexit handler frees its global state while other threads
    // (connection loops, their thread-local contexts' destructors) may still use it, which crashed
    // a program on its way out (a client exiting while a loop thread sealed its GOODBYE).
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    cipher = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
    hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    pthread_key_create(&context_key, free_contexts);
}

static contexts *thread_contexts(void) {
    pthread_once(&once, setup);
    if (cipher == NULL || hmac == NULL) return NULL;
    contexts *c = pthread_getspecific(context_key);
    if (c != NULL) return c;
    c = OPENSSL_zalloc(sizeof(contexts));
    if (c == NULL) return NULL;
    c->seal = EVP_CIPHER_CTX_new();
    c->open = EVP_CIPHER_CTX_new();
    c->hmac = EVP_MAC_CTX_new(hmac);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    if (c->seal == NULL || c->open == NULL || c->hmac == NULL || !EVP_EncryptInit_ex2(c->seal, cipher, NULL, NULL, NULL) ||
        !EVP_DecryptInit_ex2(c->open, cipher, NULL, NULL, NULL) || !EVP_MAC_CTX_set_params(c->hmac, params)) {
        free_contexts(c);
        return NULL;
    }
    pthread_setspecific(context_key, c);
    return c;
}

// The thread's sealing (or opening) context, keyed with `key` and the nonce of `counter`, the
// associated data fed; NULL on failure.
static EVP_CIPHER_CTX *begin(int sealing, const uint8_t *key, uint64_t counter, const uint8_t *ad, size_t ad_length) {
    contexts *c = thread_contexts();
    if (c == NULL) return NULL;
    EVP_CIPHER_CTX *context = sealing ? c->seal : c->open;
    uint8_t nonce[12] = {0};  // 32 zero bits, then the counter little-endian (Noise, ChaChaPoly)
    for (int i = 0; i < 8; i++) nonce[4 + i] = (uint8_t)(counter >> (8 * i));
    int written = 0;
    if (!EVP_CipherInit_ex2(context, NULL, key, nonce, sealing, NULL)) return NULL;
    if (ad_length > 0 && !EVP_CipherUpdate(context, NULL, &written, ad, (int)ad_length)) return NULL;
    return context;
}

int lanmsg_chachapoly_seal(const uint8_t *key, uint64_t counter, const uint8_t *ad, size_t ad_length,
                           const lanmsg_span *spans, int count, uint8_t *out) {
    EVP_CIPHER_CTX *context = begin(1, key, counter, ad, ad_length);
    if (context == NULL) return -1;
    int written = 0;
    uint8_t *cursor = out;
    for (int i = 0; i < count; i++) {
        if (spans[i].length == 0) continue;
        if (!EVP_EncryptUpdate(context, cursor, &written, spans[i].base, (int)spans[i].length)) return -1;
        cursor += written;
    }
    if (!EVP_EncryptFinal_ex(context, cursor, &written)) return -1;
    cursor += written;
    return EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_GET_TAG, 16, cursor) ? 0 : -1;
}

int lanmsg_chachapoly_open(const uint8_t *key, uint64_t counter, const uint8_t *ad, size_t ad_length,
                           const uint8_t *in, size_t length, const lanmsg_mutable_span *spans, int count) {
    EVP_CIPHER_CTX *context = begin(0, key, counter, ad, ad_length);
    if (context == NULL) return -1;
    if (!EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_SET_TAG, 16, (void *)(in + length))) return -1;
    int written = 0;
    const uint8_t *source = in;
    size_t left = length;
    for (int i = 0; i < count && left > 0; i++) {
        size_t take = spans[i].length < left ? spans[i].length : left;
        if (take == 0) continue;
        if (!EVP_DecryptUpdate(context, spans[i].base, &written, source, (int)take)) return -1;
        source += take;
        left -= take;
    }
    if (left != 0) return -1;
    uint8_t end[16];
    return EVP_DecryptFinal_ex(context, end, &written) > 0 ? 0 : -1;
}

void lanmsg_wipe(void *pointer, size_t length) { OPENSSL_cleanse(pointer, length); }

static int hmac_sha256(EVP_MAC_CTX *ctx, const uint8_t *key, const uint8_t *data, size_t length, uint8_t *out) {
    size_t written = 0;
    if (!EVP_MAC_init(ctx, key, 32, NULL) || !EVP_MAC_update(ctx, data, length) || !EVP_MAC_final(ctx, out, &written, 32))
        return -1;
    return written == 32 ? 0 : -1;
}

int lanmsg_noise_hkdf(const uint8_t *chaining_key, const uint8_t *ikm, size_t ikm_length, int outputs, uint8_t *out) {
    if (outputs < 1 || outputs > 3) return -1;
    contexts *c = thread_contexts();
    if (c == NULL) return -1;
    uint8_t temp_key[32];
    uint8_t input[33];
    size_t input_length = 0;
    int status = hmac_sha256(c->hmac, chaining_key, ikm, ikm_length, temp_key);
    for (int i = 0; status == 0 && i < outputs; i++) {
        // output1 = HMAC(temp_key, 0x01); output(i+1) = HMAC(temp_key, output(i) || i+1)
        input[input_length] = (uint8_t)(i + 1);
        status = hmac_sha256(c->hmac, temp_key, input, input_length + 1, out + 32 * i);
        if (status == 0) {
            memcpy(input, out + 32 * i, 32);
            input_length = 32;
        }
    }
    // The context's key state is derived from temp_key: overwrite it with a zero key's.
    uint8_t zero[32] = {0};
    (void)EVP_MAC_init(c->hmac, zero, 32, NULL);
    OPENSSL_cleanse(temp_key, sizeof temp_key);
    OPENSSL_cleanse(input, sizeof input);
    return status;
}

/* SHA-256 and HMAC-SHA-256 for the link test's challenge-response (internal). */
#ifndef ORCH_SHA256_H
#define ORCH_SHA256_H
#include <stddef.h>
#include <stdint.h>

void orch_sha256(const uint8_t *data, size_t len, uint8_t out[32]);
void orch_hmac_sha256(const uint8_t *key, size_t klen, const uint8_t *msg, size_t mlen, uint8_t out[32]);
/* Constant-time comparison: 1 when equal. */
int orch_ct_equal(const uint8_t *a, const uint8_t *b, size_t n);
/* Fills out with unpredictable bytes; returns 0 on success. */
int orch_random(uint8_t *out, size_t n);
#endif

/*-------------------------------------------------------------------------
 *
 * uuid7.c
 *		Time-ordered job ids in the UUIDv7 layout (RFC 9562).
 *
 * 48 bits of Unix time in milliseconds, the version nibble 7, 12 bits of
 * sub-millisecond time (method 3 of the RFC), the variant bits 10 and 62
 * random bits.  Within one backend the ids are strictly increasing even if
 * the clock stands still or steps back, so that jobs pushed by one session
 * sort in push order.
 *
 * Layer 3 of src/README (storage): it may call the other files of its
 * layer, those of shared memory and wake-ups (shmem.c, publish.c,
 * bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "utils/timestamp.h"

#include "storage.h"

/* Last (unix_ms << 12 | sub-ms fraction) handed out by this backend. */
static uint64 last_stamp = 0;

/*
 * Fill *uuid with a new UUIDv7.  Random bits come from the backend's PRNG,
 * which is seeded from a strong source at backend start.
 */
void
pgq_uuid7(pg_uuid_t *uuid)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		unix_us = now + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
	uint64		stamp;
	uint64		rnd = pg_prng_uint64(&pg_global_prng_state);
	int			i;

	/* 12-bit fraction of the millisecond */
	stamp = ((uint64) (unix_us / 1000) << 12) |
		(uint64) (((unix_us % 1000) * 4096) / 1000);
	if (stamp <= last_stamp)
		stamp = last_stamp + 1;
	last_stamp = stamp;

	/* unix_ts_ms: 48 bits */
	for (i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (stamp >> (12 + 8 * (5 - i)));
	/* version 7 and the 12-bit fraction */
	uuid->data[6] = (unsigned char) (0x70 | ((stamp >> 8) & 0x0F));
	uuid->data[7] = (unsigned char) (stamp & 0xFF);
	/* variant 10 and 62 random bits */
	uuid->data[8] = (unsigned char) (0x80 | ((rnd >> 56) & 0x3F));
	for (i = 9; i < 16; i++)
		uuid->data[i] = (unsigned char) (rnd >> (8 * (15 - i)));
}

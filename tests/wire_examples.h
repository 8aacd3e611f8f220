/*
 * wire_examples.h - one filled example of every control-plane message
 * (common/wire.h), every field set to something its reader accepts under
 * fy_test_wire_lim: the unit test's round trips and refusals start from
 * them, and the fuzz target's seeds are them written (mkseeds.c).
 *
 * Not here: messages a reader must refuse (tests/test_wire.c makes those
 * from these).
 */
#ifndef FY_WIRE_EXAMPLES_H
#define FY_WIRE_EXAMPLES_H

#include "common/wire.h"

/* What the examples assume of their reader: a 49152-token vocabulary,
 * 4096-token prompts, an 8192-token context, 16-token blocks, replies
 * about a 40-token prompt. */
extern const fy_wire_lim_t fy_test_wire_lim;

/* Fills m (s's struct) with the example; arrays point at static data (do
 * not clear m). */
void fy_test_wire_example(const fy_wire_schema_t *s, void *m);

#endif /* FY_WIRE_EXAMPLES_H */

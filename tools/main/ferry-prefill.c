/* ferry-prefill - a prefill worker process: fy_node_main with the prefill role. */
#include "prefill/prefill_worker.h"

int main(int argc, char **argv) { return fy_node_main(argc, argv, &fy_prefill_role); }

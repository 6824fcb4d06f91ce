"""extract.py (glue_emu) — the device code of the glue kernels, cut out of their sources for the host emulation
(emu.h): OUT/conv.inc (cuda_conv.cu's run kernels and the fused GDN conv + split), OUT/norm.inc (cuda_rmsnorm.cu's kernels, cuda_norm.cu's gated
RMSNorm group kernels), OUT/ew.inc (cuda_elementwise.cu's sigmoid gate and SwiGLU), each after cuda_device.cuh's
device helpers (the L2 prefetch's asm dropped) and the sources' own defines. The cuts are by the section comments
and signatures below; one that is gone stops the build, naming it. Usage: extract.py ROOT OUT

ROOT may be an older revision (split_build.sh extracts a base one): the conv's layout is read from the files
present. Since the fused GDN conv + split left cuda_conv.cu: the run walk's shared constants and steps in
cuda_conv_run.cuh, the run kernels in cuda_conv.cu, the fused kernels in cuda_gdn_conv_split.cu; before, all three
in cuda_conv.cu. conv.inc holds the same definitions either way."""
import os
import re
import sys

root, out = sys.argv[1], sys.argv[2]


def read(path):
    return open(f"{root}/{path}").read()


def cut(text, start, end, path):
    i = text.find(start)
    if i < 0:
        sys.exit(f"extract.py: '{start}' is no longer in {path}: update tests/cuda/glue_emu/extract.py")
    j = text.find(end, i)
    if j < 0:
        sys.exit(f"extract.py: '{end}' is no longer in {path} after '{start}': update tests/cuda/glue_emu/extract.py")
    return text[i:j]


dev = read("kernels/cuda/cuda_device.cuh")
dev_defs = "\n".join(l for l in dev.splitlines() if re.match(r"#define CUDA_", l)) + "\n"
dev_code = cut(dev, "/* ---- vector access ---- */", "static inline void cuda_partials_add(", "cuda_device.cuh")
dev_code = dev_code.replace('asm volatile("prefetch.global.L2 [%0];" ::"l"(p));', "(void)p;")
head = dev_defs + dev_code

conv = read("kernels/cuda/cuda_conv.cu")
if os.path.exists(f"{root}/kernels/cuda/cuda_conv_run.cuh"):  # the shared header, the run kernels, the fused ones
    run, split = read("kernels/cuda/cuda_conv_run.cuh"), read("kernels/cuda/cuda_gdn_conv_split.cu")
    conv_inc = "".join([
        cut(run, "#define CONV_RUN_KC", "/* ---- host:", "cuda_conv_run.cuh"),
        cut(conv, "#define CONV_KC_MAX", "static void conv_check_sizes", "cuda_conv.cu"),
        cut(conv, "/* ---- Kc = CONV_RUN_KC", 'extern "C" void cuda_conv1d_silu_forward', "cuda_conv.cu"),
        cut(split, "#define CONV_SPLIT_GB", "/* the fused GDN conv + split's sizes", "cuda_gdn_conv_split.cu")])
else:  # all in cuda_conv.cu (revisions before cuda_gdn_conv_split.cu)
    conv_inc = "".join([
        cut(conv, "#define CONV_KC_MAX", "static void conv_check_sizes", "cuda_conv.cu"),
        cut(conv, "__device__ __forceinline__ float conv_sigmoid", "/* u[t, c..c+n) into u[]", "cuda_conv.cu"),
        cut(conv, "/* the n <= CONV_CV bf16 at p", 'extern "C" void cuda_conv1d_silu_forward', "cuda_conv.cu")])
l2eps = "\n".join(l for l in read("kernels/cuda/cuda_norm.cuh").splitlines() if l.startswith("#define L2NORM_EPS"))
open(f"{out}/conv.inc", "w").write(head + l2eps + "\n" + conv_inc)

nh = read("kernels/cuda/cuda_norm.cuh")
helpers = cut(nh, "#define NORM_WARPS", "static inline int norm_rows_blocks", "cuda_norm.cuh") + \
    cut(nh, "#define NORM_GROUP_THREADS", "#endif", "cuda_norm.cuh")
rms = cut(read("kernels/cuda/cuda_rmsnorm.cu"), "/* ---- RMSNorm", "/* launches the group forward for D", "cuda_rmsnorm.cu")
gated = cut(read("kernels/cuda/cuda_norm.cu"), "/* ---- gated RMSNorm, group kernels",
            "/* launches the group kernel of LPR lanes for dv", "cuda_norm.cu")
norm_inc = (head + helpers + rms + gated).replace("extern __shared__ float norm_slices[];",
                                                  "float *norm_slices = emu_dyn_smem;")
open(f"{out}/norm.inc", "w").write(norm_inc)

ew = read("kernels/cuda/cuda_elementwise.cu")
ew_inc = ("#define EW_THREADS 256\n" + head
          + cut(ew, "__global__ void __launch_bounds__(EW_THREADS) ew_sigmoid_gate_forward_kernel",
                'extern "C" void cuda_sigmoid_gate_forward', "cuda_elementwise.cu")
          + cut(ew, "/* silu(g) u, the one expression", 'extern "C" void cuda_swiglu_forward', "cuda_elementwise.cu"))
open(f"{out}/ew.inc", "w").write(ew_inc)

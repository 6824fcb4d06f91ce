"""transform.py (kda_emu) — a .cu / .cuh file for the host emulation: `kernel<<<cfg>>>(args)` becomes
`emu_launch(kernel, emu_cfg(cfg), args)`, `extern __shared__` a plain extern (inc/cuda_common.h defines
__shared__ as static for the function-static arrays), and an L2 prefetch (inline PTX that moves no value) the
evaluation of its address. Used by build.sh here and by tests/cuda/gdn_emu's build scripts.
Usage: transform.py SRC DST"""
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = s.replace('extern __shared__', 'extern')
s = re.sub(r'asm volatile\("prefetch\.global\.L2 \[%0\];\\n" *:: *"l"\((.*)\)\);', r'(void)(\1);', s)
out = []; i = 0
while True:
    j = s.find('<<<', i)
    if j < 0: out.append(s[i:]); break
    m = re.search(r'([A-Za-z_][A-Za-z_0-9]*(?:<[^<>]*>)?)\s*$', s[i:j])  # a kernel, or a template's instance
    name_start = i + m.start(1)
    out.append(s[i:name_start])
    name = m.group(1)
    k = s.find('>>>', j)
    cfg = s[j+3:k]
    p = s.find('(', k)
    depth = 0; q = p
    while True:
        if s[q] == '(': depth += 1
        elif s[q] == ')':
            depth -= 1
            if depth == 0: break
        q += 1
    args = s[p+1:q]
    out.append('emu_launch(%s, emu_cfg(%s), %s)' % (name, cfg, args))
    i = q + 1
open(dst, 'w').write(''.join(out))

#!/usr/bin/env python3
"""cubin_compare.py — compares the machine code of every kernel function between two sets of cubins.

    cubin_compare.py BASE_DIR NEW_DIR [--renames FILE]

BASE_DIR and NEW_DIR hold the .cubin files of one build each (tests/cuda/cubin_compare.sh makes them).
A cubin is an ELF file; each function's SASS lives in its own section `.text.<mangled name>`. For every
function the comparison takes: the section's bytes (the instructions, with relocated fields as the
compiler left them), its relocations resolved to symbol names (so a call or a constant reference to a
different target differs even where the bytes agree), its resources (the .nv.info attributes:
registers, frame and stack sizes, parameter layout, exit offsets), and the sizes of its static shared memory and parameter bank (`.nv.shared.<name>`,
`.nv.constant0.<name>`). Symbol indices, line tables and the file a function came from are left out, so
a function that only moved between files, or whose file grew other functions, compares equal.

Names are compared demangled (c++filt) and with `static` internal-linkage marks dropped; the renames
file (lines `OLD NEW`: substrings, or `s|PATTERN|REPLACEMENT|`: a Python regular expression; `#`
comments) maps base names onto new names, for kernels renamed on purpose. Prints one line per function that is not identical, then the counts; the exit
status is 0 when every base function is identical in NEW or listed as removed, 1 when any changed.
No cuobjdump is needed: the toolkit on the development machine ships only nvcc and ptxas.
"""
import os
import re
import struct
import subprocess
import sys


def elf_sections(data):
    """[(name, type, flags, info, bytes, link)] of an ELF64 little-endian file"""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not an ELF64 little-endian file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]

    def name_at(off):
        return names[off:names.index(b"\0", off)].decode()

    out = []
    for h in hdrs:
        name, typ, flags, _addr, off, size, link, info = h[:8]
        body = data[off:off + size] if typ != 8 else b""  # SHT_NOBITS: no bytes in the file
        out.append((name_at(name), typ, flags, info, body, link, size))
    return out


def symbols(sections):
    for s in sections:
        if s[1] == 2:  # SHT_SYMTAB
            strs = sections[s[5]][4]
            syms = []
            for i in range(0, len(s[4]), 24):
                st_name = struct.unpack_from("<I", s[4], i)[0]
                syms.append(strs[st_name:strs.index(b"\0", st_name)].decode())
            return syms
    return []


def nv_info(body):
    """the attributes of a .nv.info section: [(attr, value bytes)]"""
    out, i = [], 0
    while i + 4 <= len(body):
        fmt, attr = body[i], body[i + 1]
        if fmt == 4:  # a sized value
            size = struct.unpack_from("<H", body, i + 2)[0]
            out.append((attr, body[i + 4:i + 4 + size]))
            i += 4 + size
        else:  # a 2-byte value (or none)
            out.append((attr, body[i + 2:i + 4]))
            i += 4
    return out


PARAM_CBANK = 0x0A  # its value starts with a symbol index: left out with it


def functions(path):
    """{mangled name: (text bytes, relocations, resources, shared bytes, param bytes)}; resources: the
    function's attributes of .nv.info (registers, frame and stack sizes, keyed by its symbol) and of
    .nv.info.<name> (parameter layout, exit offsets, ...)"""
    with open(path, "rb") as f:
        secs = elf_sections(f.read())
    syms = symbols(secs)
    by_name = {s[0]: s for s in secs}
    glob = nv_info(by_name[".nv.info"][4]) if ".nv.info" in by_name else []
    out = {}
    for s in secs:
        if not s[0].startswith(".text."):
            continue
        fn = s[0][len(".text."):]
        relocs = []
        for rname, rtype in ((".rel.text." + fn, 9), (".rela.text." + fn, 4)):
            r = by_name.get(rname)
            if not r:
                continue
            step = 16 if rtype == 9 else 24
            for i in range(0, len(r[4]), step):
                off, info = struct.unpack_from("<QQ", r[4], i)
                add = struct.unpack_from("<q", r[4], i + 16)[0] if step == 24 else 0
                sym = syms[info >> 32] if (info >> 32) < len(syms) else "?"
                relocs.append((off, info & 0xFFFFFFFF, sym, add))
        shared = by_name.get(".nv.shared." + fn)
        const0 = by_name.get(".nv.constant0." + fn)
        res = [(a, v[4:]) for a, v in glob if len(v) >= 4 and syms[struct.unpack_from("<I", v)[0]] == fn]
        info = by_name.get(".nv.info." + fn)
        res += [(a, v[4:] if a == PARAM_CBANK else v) for a, v in (nv_info(info[4]) if info else [])]
        out[fn] = (s[4], tuple(relocs), tuple(res), shared[6] if shared else 0, const0[6] if const0 else 0)
    return out


def demangle(names):
    if not names:
        return {}
    p = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    return dict(zip(names, p.stdout.split("\n")))


def load(folder):
    funcs = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".cubin"):
            for k, v in functions(os.path.join(folder, f)).items():
                funcs[k] = (v, f)
    dm = demangle(sorted(funcs))
    return {dm[k]: (v, f) for k, (v, f) in funcs.items()}


def main():
    args = sys.argv[1:]
    renames = []  # (old, new) substrings, or (compiled pattern, replacement) for `s|PATTERN|REPLACEMENT|` lines
    if "--renames" in args:
        i = args.index("--renames")
        with open(args[i + 1]) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line.startswith("s|"):
                    _, pat, repl, _ = line.split("|")
                    renames.append((re.compile(pat), repl))
                elif len(line.split()) == 2:
                    renames.append(tuple(line.split()))
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        return 2

    def rename(n):
        for old, new in renames:
            n = old.sub(new, n) if isinstance(old, re.Pattern) else n.replace(old, new)
        return n

    base, new = load(args[0]), load(args[1])
    # a base function whose name a rename gives to another one (a deleted kernel whose name the renamed
    # production kernel takes over) is kept apart, as removed
    renamed = {k: rename(k) for k in base}
    taken = {n for k, n in renamed.items() if n != k}
    base = {(n if n != k or n not in taken else n + "  [deleted; its name went to a renamed kernel]"): base[k]
            for k, n in renamed.items()}
    allsyms = sorted(set(base) | set(new))
    ident, changed, removed, added = [], [], [], []
    for n in allsyms:
        if n not in new:
            removed.append(n)
        elif n not in base:
            added.append(n)
        else:
            (b, bf), (c, cf) = base[n], new[n]
            bb = (b[0], tuple((o, t, rename(s), a) for o, t, s, a in b[1]), b[2], b[3], b[4])
            what = []
            if bb[0] != c[0]:
                what.append("code (%d -> %d bytes)" % (len(bb[0]), len(c[0])))
            if bb[1] != c[1] and bb[0] == c[0]:
                what.append("relocations")
            if bb[2] != c[2]:
                regs = [[int.from_bytes(v, "little") for a, v in x[2] if a == 0x2F] for x in (bb, c)]
                what.append("resources" + (" (registers %s -> %s)" % tuple(regs) if regs[0] != regs[1] else ""))
            if bb[3] != c[3]:
                what.append("shared %d -> %d" % (bb[3], c[3]))
            if bb[4] != c[4]:
                what.append("params %d -> %d" % (bb[4], c[4]))
            (changed if what else ident).append((n, bf, cf, ", ".join(what)))
    for n, bf, cf, what in changed:
        print("changed  %s  [%s -> %s]  %s" % (n, bf, cf, what))
    for n in removed:
        print("removed  %s  [%s]" % (n, base[n][1]))
    for n in added:
        print("added    %s  [%s]" % (n, new[n][1]))
    print("cubin_compare: %d identical, %d changed, %d removed, %d added (functions of %s vs %s)" %
          (len(ident), len(changed), len(removed), len(added), args[0], args[1]))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

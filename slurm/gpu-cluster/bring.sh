#!/bin/bash
# bring.sh — on a Debian machine that reaches Debian's package archive (apt), makes the folder that takes the
# two-node GPU test cluster to a machine that reaches no package registry: Debian's Slurm and munge packages
# with the libraries they need beyond a base system, the ringscan binary (stripped, gzip) and a tiny MPI
# program for the launch checks. The GPU machine installs them with slurm/gpu-cluster/install.sh.
#
#   slurm/gpu-cluster/bring.sh [--ringscan BIN] [--listing FILE] [--out DIR] [--packages-only]
#
#   --ringscan BIN  the binary to bring (default build/ringscan; a cuda build: `--version` names cuda)
#   --listing FILE  the packages the GPU machine has (`dpkg-query -W -f '${Package}\n'` there, one name a
#                   line): those are left out; without it every package past Debian's required set comes
#   --out DIR       where the folder goes (default .carry/gpu-cluster, which git ignores; name it in the
#                   device tool's `carry`)
#   --packages-only the packages alone (tests/test_gpu_cluster.py)
#
# Two sets of packages, because Slurm's PMIx plugin loads the machine's PMIx library
# (/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so) and refuses any other major version than its own, and
# the ranks' Open MPI brings whichever PMIx its distribution has: bookworm (Debian 12: Slurm 22.05, PMIx 4,
# glibc 2.36) and trixie (Debian 13: Slurm 24.11, PMIx 5, glibc 2.38); install.sh takes the set that
# matches the machine. Each set is the dependency closure (apt's own resolver, recommends left out) of
# slurmctld, slurmd, slurm-client, munge and the PMIx library of that release, less what a base system of
# that release has (its Priority: required packages and their dependencies) and less --listing; of that,
# what the programs load (the libraries their ELF files name, found in the set, recursively). apt works in a private
# directory with the host's own Debian mirrors: nothing on this machine changes. Prints the folder's size
# and the device call's total (with the working tree), which must stay under the tool's 64 MiB.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
RINGSCAN=build/ringscan
LISTING=
OUT=.carry/gpu-cluster
ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --ringscan) RINGSCAN=$2; shift 2 ;;
        --listing) LISTING=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --packages-only) ONLY=1; shift ;;
        *) echo "bring.sh: unknown argument $1 (see the header of $0)"; exit 2 ;;
    esac
done
fail() { echo "bring.sh: FAILED: $*"; exit 1; }
for b in apt-get apt-cache dpkg-deb readelf mpicc strip gzip python3; do
    command -v $b > /dev/null || fail "$b is missing here (this script needs a Debian machine with apt, Open MPI's mpicc, binutils)"
done
[ $ONLY = 1 ] || [ -x "$RINGSCAN" ] || fail "$RINGSCAN is not there: build it first (make build/ringscan, with nvcc)"
[ $ONLY = 1 ] || "$RINGSCAN" --version | grep -q "backends.*cuda (" ||
    fail "$RINGSCAN is not a cuda build (its --version: $("$RINGSCAN" --version | grep backends))"
[ -z "$LISTING" ] || [ -s "$LISTING" ] || fail "--listing $LISTING is empty or missing"

# the host's Debian mirrors (main and security), as its apt knows them: nothing is named here
MAIN=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2> /dev/null | awk '$2 !~ /-/ {print $1; exit}')
SECURITY=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2> /dev/null | awk '$2 ~ /-security$/ {print $1; exit}')
[ -n "$MAIN" ] || fail "apt knows no Debian mirror here (apt-get indextargets lists none; run apt-get update)"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -s $KEYRING ] || fail "$KEYRING is missing (package debian-archive-keyring)"

rm -rf "$OUT" && mkdir -p "$OUT/bin" || fail "cannot create $OUT"
WORK=$(mktemp -d /tmp/bring.XXXXXX)
[ -n "${BRING_KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT
cut -d' ' -f1 "${LISTING:-/dev/null}" | sed 's/:.*//' | sort -u > "$WORK/listing"

# packages SUITE PMIX_LIB: one set into $OUT/debs/SUITE
packages() {
    local suite=$1 pmix=$2 a=$WORK/apt-$1
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/parts" "$OUT/debs/$suite"
    {
        printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n' "$MAIN" "$suite" "$suite" $KEYRING
        [ -z "$SECURITY" ] || printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n' \
            "$SECURITY" "$suite" $KEYRING
    } > "$a/parts/$suite.sources"
    : > "$a/status"
    local o=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$a/parts" -o "Dir::State::lists=$a/lists"
        -o "Dir::Cache=$a/cache" -o "Dir::State::status=$a/status" -o APT::Install-Recommends=false
        -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o Debug::NoLocking=1)
    apt-get "${o[@]}" update > "$a/update.log" 2>&1 || { cat "$a/update.log"; fail "apt-get update of $suite"; }
    # the base system: Priority required (and Essential) packages, then everything they need
    apt-cache "${o[@]}" dumpavail | python3 -c '
import re, sys
for s in sys.stdin.read().split("\n\n"):
    f = dict(re.findall(r"^([\w-]+): (.*)$", s, re.M))
    if "Package" in f and (f.get("Priority") == "required" or f.get("Essential") == "yes"):
        print(f["Package"])' | sort -u > "$a/required"
    apt-get "${o[@]}" -s install $(cat "$a/required") 2> "$a/sim.err" | awk '/^Inst/ {print $2}' | sort -u > "$a/base" ||
        { cat "$a/sim.err"; fail "apt could not resolve $suite's base system"; }
    apt-get "${o[@]}" -s install $(cat "$a/required") slurmctld slurmd slurm-client munge "$pmix" 2> "$a/sim.err" |
        awk '/^Inst/ {print $2}' | sort -u > "$a/all" || { cat "$a/sim.err"; fail "apt could not resolve Slurm on $suite"; }
    [ -s "$a/base" ] && grep -qx slurmd "$a/all" || { cat "$a/sim.err"; fail "apt resolved nothing for $suite"; }
    comm -23 <(comm -13 "$a/base" "$a/all") "$WORK/listing" > "$a/want"
    (cd "$OUT/debs/$suite" && apt-get "${o[@]}" download $(cat "$a/want")) > "$a/download.log" 2>&1 ||
        { cat "$a/download.log"; fail "apt-get download for $suite"; }
    # what the programs load: from the daemons', clients' and plugins' ELF files, every library they name
    # (DT_NEEDED) that one of the packages holds, and that library's own, and so on; the rest of apt's
    # closure (hwloc's optional plugins with X11, XML and OpenCL, systemd, the install scripts' helpers)
    # is never loaded here, since install.sh unpacks and runs no package scripts: it is left behind
    python3 - "$OUT/debs/$suite" "$a/x" slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge "$pmix" <<'PY' ||
import os, subprocess, sys
debs, x, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
files = {}  # file name -> package
elves = {}  # package -> its ELF files
for deb in sorted(os.listdir(debs)):
    pkg = deb.split("_")[0]
    d = os.path.join(x, pkg)
    os.makedirs(d)
    subprocess.run(["dpkg-deb", "-x", os.path.join(debs, deb), d], check=True)
    for top, _, names in os.walk(d):
        for n in names:
            f = os.path.join(top, n)
            files.setdefault(n, pkg)
            if not os.path.islink(f) and open(f, "rb").read(4) == b"\x7fELF":
                elves.setdefault(pkg, []).append(f)
keep, todo = set(), [r for r in roots]
while todo:
    pkg = todo.pop()
    if pkg in keep:
        continue
    keep.add(pkg)
    for f in elves.get(pkg, []):
        out = subprocess.run(["readelf", "-d", f], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if "(NEEDED)" in line:
                so = line.split("[")[1].split("]")[0]
                if so in files and files[so] not in keep:
                    todo.append(files[so])
for deb in os.listdir(debs):
    if deb.split("_")[0] not in keep:
        os.remove(os.path.join(debs, deb))
missing = [r for r in roots if r not in keep or not any(d.startswith(r + "_") for d in os.listdir(debs))]
sys.exit(f"not downloaded: {missing}" if missing else 0)
PY
        fail "the runtime closure of $suite"
    echo "$suite: $(ls "$OUT/debs/$suite" | wc -l) packages, $(du -sh "$OUT/debs/$suite" | cut -f1):" \
        "$(ls "$OUT/debs/$suite" | sed 's/_.*//' | tr '\n' ' ')"
}
packages bookworm libpmix2
packages trixie libpmix2t64

# the binaries: ringscan stripped and compressed, and the MPI check program
if [ $ONLY = 0 ]; then
strip -o "$WORK/ringscan" "$RINGSCAN" && gzip -6 -c "$WORK/ringscan" > "$OUT/bin/ringscan.gz" || fail "strip/gzip $RINGSCAN"
mpicc -O2 -o "$OUT/bin/mpi_hello" slurm/gpu-cluster/mpi_hello.c || fail "mpicc slurm/gpu-cluster/mpi_hello.c"
fi
{
    echo "made by slurm/gpu-cluster/bring.sh on $(date -u '+%F %T') UTC"
    [ $ONLY = 1 ] || "$RINGSCAN" --version | sed 's/^/ringscan: /'
    for s in bookworm trixie; do echo "$s: $(ls "$OUT/debs/$s" | tr '\n' ' ')"; done
    [ -z "$LISTING" ] || echo "left out: the $(wc -l < "$WORK/listing") packages of $LISTING"
} > "$OUT/MANIFEST"

size=$(du -sb "$OUT" | cut -f1)
tree=$(git ls-files -z | xargs -0 cat 2> /dev/null | wc -c)
total=$((size + tree))
echo "bring.sh: $OUT holds $((size / 1024)) KiB (ringscan.gz $(($(stat -c %s "$OUT/bin/ringscan.gz" 2> /dev/null || echo 0) / 1024)) KiB);" \
    "with the working tree ($((tree / 1024)) KiB) a device call carries $((total / 1024)) KiB of its 65536"
[ "$total" -lt $((64 * 1024 * 1024)) ] || fail "over the device tool's 64 MiB"
git check-ignore -q "$OUT" || echo "bring.sh: warning: git does not ignore $OUT (it would travel untracked anyway; add it to .git/info/exclude)"

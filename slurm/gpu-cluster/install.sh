#!/bin/bash
# install.sh — installs the Slurm and munge that bring.sh carried (BUNDLE/debs/<release>) on a machine that
# reaches no package registry, as root, without dpkg's database or any package script: each package is
# unpacked (dpkg-deb -x) and its files are added to / where no file of that name exists, so nothing the
# machine has is replaced; packages the machine already has (dpkg says so, or every library soname the
# package holds, lib*.so.N, is there already) are left out. Then it checks that every daemon, client and plugin the
# test cluster uses finds its libraries, and that Slurm's PMIx plugin will load a PMIx of its own major
# version. Prints what it did and, on failure, what is missing; exit 1 then.
#
#   slurm/gpu-cluster/install.sh [BUNDLE]            (default .carry/gpu-cluster)
#
# Which release's set: the one whose PMIx matches the machine's. Slurm's PMIx plugin opens
# /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so and refuses another major version than the one it was
# built for, and the ranks' Open MPI uses the machine's PMIx: PMIx 5 there (Ubuntu 24.04's Open MPI, Debian
# 13's) takes trixie's Slurm 24.11 (needs glibc 2.38), PMIx 4 or none takes bookworm's Slurm 22.05 and its
# PMIx 4. RELEASE=bookworm|trixie overrides. Environment: ROOT (default /: where files go; another folder
# only for tests, which then skip the load checks), PREFIX (default /opt/rs-slurm: the unpacked packages
# and added.txt, the files added to ROOT).
set -u -o pipefail
BUNDLE=${1:-.carry/gpu-cluster}
ROOT=${ROOT:-/}
PREFIX=${PREFIX:-/opt/rs-slurm}
ARCH_LIB=usr/lib/x86_64-linux-gnu
fail() { echo "install.sh: FAILED: $*"; exit 1; }
[ -d "$BUNDLE/debs" ] || fail "$BUNDLE/debs is missing: run slurm/gpu-cluster/bring.sh where apt works and carry $BUNDLE"
command -v dpkg-deb > /dev/null || fail "dpkg-deb is missing: this script needs a Debian or Ubuntu machine"

glibc=$(getconf GNU_LIBC_VERSION 2> /dev/null | awk '{print $2}')
pmix_so=$ROOT/$ARCH_LIB/pmix2/lib/libpmix.so.2
pmix_version() { grep -a -o -m1 'OpenPMIx [0-9][0-9.a-z]*' "$1" 2> /dev/null | head -1 | awk '{print $2}'; }
have_pmix=$( [ -e "$pmix_so" ] && pmix_version "$pmix_so")
echo "install.sh: machine: $(. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME"), glibc ${glibc:-?}," \
    "PMIx at $pmix_so: ${have_pmix:-none}"
if [ -z "${RELEASE:-}" ]; then
    case "${have_pmix%%.*}" in
        5) RELEASE=trixie ;;
        4 | "") RELEASE=bookworm ;;
        *) fail "the machine's PMIx $have_pmix matches neither carried Slurm (bookworm: PMIx 4, trixie: PMIx 5)" ;;
    esac
fi
need=2.36
[ "$RELEASE" = trixie ] && need=2.38
if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" != "$need" ]; then
    fail "$RELEASE's Slurm needs glibc $need, the machine has $glibc"
fi
[ -d "$BUNDLE/debs/$RELEASE" ] || fail "$BUNDLE/debs/$RELEASE is missing"
echo "install.sh: $RELEASE's Slurm (its PMIx major matches the machine's ${have_pmix:-none})"

mkdir -p "$PREFIX/pkgs" && : > "$PREFIX/added.txt" || fail "cannot write $PREFIX"
installed() { [ "$ROOT" = / ] && dpkg-query -W -f '${Status}' "$1" 2> /dev/null | grep -q "ok installed"; }
added=() kept=()
for deb in "$BUNDLE/debs/$RELEASE"/*.deb; do
    pkg=$(dpkg-deb -f "$deb" Package)
    d=$PREFIX/pkgs/$pkg
    rm -rf "$d" && mkdir -p "$d" && dpkg-deb -x "$deb" "$d" || fail "cannot unpack $deb"
    if installed "$pkg"; then kept+=("$pkg (installed)"); continue; fi
    libs=$(cd "$d" && find . -name 'lib*.so.*' \( -type f -o -type l \) | grep -E '\.so\.[0-9]+$' | sed 's|^\./||')
    if [ -n "$libs" ] && [ "${pkg#lib}" != "$pkg" ]; then
        all=1
        for l in $libs; do [ -e "$ROOT/$l" ] || all=0; done
        if [ $all = 1 ]; then kept+=("$pkg (the machine's $(basename "$(echo "$libs" | head -1)"))"); continue; fi
    fi
    # the package's files where the machine has none of that name; links to directories (/lib -> usr/lib)
    # are kept as they are
    (cd "$d" && find . ! -type d | sed 's|^\./||') | while read -r f; do
        [ -e "$ROOT/$f" ] || [ -L "$ROOT/$f" ] || echo "$f"
    done > "$d.new"
    tar -C "$d" -cf - -T "$d.new" | tar -C "$ROOT" -xf - --keep-directory-symlink --skip-old-files ||
        fail "cannot add $pkg's files to $ROOT"
    sed "s|^|$pkg /|" "$d.new" >> "$PREFIX/added.txt"
    added+=("$pkg")
done
# the names the packages' scripts would have made with update-alternatives (slurmd runs
# /usr/sbin/slurmstepd): a link to each added program *-wlm
for f in $(grep -E ' /usr/s?bin/[a-z]+-wlm$' "$PREFIX/added.txt" | cut -d' ' -f2); do
    [ -e "$ROOT/${f%-wlm}" ] || ln -s "$(basename "$f")" "$ROOT/${f%-wlm}" || fail "cannot link ${f%-wlm}"
done
echo "install.sh: added ${#added[@]} packages (${added[*]}); left ${#kept[@]} to the machine: ${kept[*]}"
echo "install.sh: $(wc -l < "$PREFIX/added.txt") files added to $ROOT (list: $PREFIX/added.txt)"

# Slurm's PMIx plugin dlopen()s the unversioned name, which only a -dev package has: the link, if missing
link=$ROOT/$ARCH_LIB/pmix2/lib/libpmix.so
if [ ! -e "$link" ]; then
    [ -e "$pmix_so" ] || fail "no PMIx library at $pmix_so after the install"
    ln -s libpmix.so.2 "$link" || fail "cannot create $link"
    echo "install.sh: made $link -> libpmix.so.2 (Slurm's PMIx plugin opens that name)"
fi
got=$(pmix_version "$(readlink -f "$link")")
want=4
[ "$RELEASE" = trixie ] && want=5
[ "${got%%.*}" = "$want" ] || fail "$link is PMIx ${got:-?}; $RELEASE's Slurm loads PMIx $want only"
echo "install.sh: Slurm's PMIx plugin will load PMIx $got ($link)"

[ "$ROOT" = / ] || { echo "install.sh: ROOT=$ROOT: no load checks"; exit 0; }
ldconfig
plugins=/usr/lib/x86_64-linux-gnu/slurm-wlm
bad=""
for f in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd /usr/sbin/munged /usr/bin/munge /usr/bin/sbatch \
    /usr/bin/srun /usr/bin/squeue /usr/bin/scontrol /usr/bin/scancel /usr/bin/sinfo $plugins/auth_munge.so \
    $plugins/cred_munge.so $plugins/select_cons_tres.so $plugins/gres_gpu.so $plugins/mpi_pmix.so \
    $plugins/proctrack_linuxproc.so $plugins/sched_backfill.so "$link"; do
    [ -e "$f" ] || { bad="$bad\n  $f: missing"; continue; }
    miss=$(ldd "$f" 2>&1 | grep -E "not found|version .* not found" | sed 's/^[[:space:]]*//' | tr '\n' ';')
    [ -z "$miss" ] || bad="$bad\n  $f: $miss"
done
[ -z "$bad" ] || fail "programs that cannot load:$(printf "$bad")"
echo "install.sh: every daemon, client and plugin loads: $(slurmctld -V) ($RELEASE), $(munged --version 2>&1 | head -1)"

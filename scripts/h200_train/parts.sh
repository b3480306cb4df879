#!/usr/bin/env bash
# Split a folder into parts that fit a device call beside the working tree, with a checksum list, and join them back (issues 9, 20).
# One device call carries at most 64 MiB, so what must travel goes as parts, one or two per call.
#   bash scripts/h200_train/parts.sh tree                                      the bytes every call carries beside its parts
#   bash scripts/h200_train/parts.sh budget                                    the bytes one part may have: 64 MiB less the
#                                                                              working tree and 2 MiB, at most 42 MiB
#   bash scripts/h200_train/parts.sh pack   SRC_DIR PARTS_DIR PREFIX [BYTES]   tar of SRC_DIR's contents -> PREFIX-aa, -ab ...
#   bash scripts/h200_train/parts.sh resplit PARTS_DIR PREFIX SUMS [BYTES]     cut existing parts again (a grown tree)
#   bash scripts/h200_train/parts.sh verify PARTS_DIR PREFIX                   every listed part present, sums right
#   bash scripts/h200_train/parts.sh unpack PARTS_DIR PREFIX DEST              verify, then join and untar into DEST
# PREFIX.sha256 lists every part, so a part that never arrived is an error, not silently skipped.
set -euo pipefail
cmd=${1:?usage: parts.sh pack|verify|unpack ...}
shift
tree() {
  # what travels with every call: tracked and untracked-not-ignored files (the device README's limit covers them too)
  (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}
budget() {
  local tree
  tree=$(tree)
  # 5 MiB spare: a call of 62.7 MiB by this count (21.9 + 40.8) was refused as over 64 MiB on 2026-12-05
  local b=$(( 64 * 1048576 - tree - 5 * 1048576 ))
  [ "$b" -gt 44040192 ] && b=44040192
  [ "$b" -lt 8388608 ] && { echo "the working tree ($tree bytes) leaves under 8 MiB a call for parts: ignore or move files" >&2; exit 4; }
  echo "$b"
}
case "$cmd" in
  budget) budget ;;
  tree) tree ;;
  resplit)
    dir=${1:?PARTS_DIR}; prefix=${2:?PREFIX}; sums=${3:?SUMS}; bytes=${4:-$(budget)}
    (cd "$dir" && awk '{print $2}' "$sums" | xargs cat) > "$dir/.joined"
    rm -f "$dir/$prefix"-??
    split -b "$bytes" "$dir/.joined" "$dir/$prefix-" && rm -f "$dir/.joined"
    (cd "$dir" && sha256sum "$prefix"-?? > "$sums")
    cat "$dir/$sums"
    ;;
  pack)
    src=${1:?SRC_DIR}; dir=${2:?PARTS_DIR}; prefix=${3:?PREFIX}; bytes=${4:-$(budget)}
    mkdir -p "$dir"
    rm -f "$dir/$prefix"-?? "$dir/$prefix.sha256"
    tar cf - -C "$src" . | split -b "$bytes" - "$dir/$prefix-"
    (cd "$dir" && sha256sum "$prefix"-?? > "$prefix.sha256")
    cat "$dir/$prefix.sha256"
    ;;
  verify)
    dir=${1:?PARTS_DIR}; prefix=${2:?PREFIX}
    [ -f "$dir/$prefix.sha256" ] || { echo "no $dir/$prefix.sha256: ship the parts first" >&2; exit 3; }
    if ! (cd "$dir" && sha256sum --quiet -c "$prefix.sha256"); then
      echo "parts of $prefix missing or corrupt in $dir (machine went cold between calls?): ship them again" >&2
      ls -la "$dir" >&2
      exit 3
    fi
    ;;
  unpack)
    dir=${1:?PARTS_DIR}; prefix=${2:?PREFIX}; dest=${3:?DEST}
    bash "$0" verify "$dir" "$prefix"
    mkdir -p "$dest"
    # join in the order the checksum list gives (split's suffixes sort as written)
    (cd "$dir" && awk '{print $2}' "$prefix.sha256" | xargs cat) | tar xf - -C "$dest"
    ;;
  *)
    echo "unknown command $cmd: use pack, verify or unpack" >&2
    exit 2
    ;;
esac

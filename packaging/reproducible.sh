# Sourced (not run) by packaging/build and packaging/build-image: the
# settings that make a release build's bytes depend on the source and the
# pinned tools only, not on where, when or by whom it was built.
#
#   SOURCE_DATE_EPOCH  the commit's time (git log -1 %ct) unless already
#                      set (packaging/release sets it for a copy without
#                      .git); the .deb and .rpm clamp their files' mtimes
#                      and their build time to it, the image and chart
#                      archives are written with it.
#   RUSTFLAGS          --remap-path-prefix for the source directory, the
#                      target directory and cargo's home (the registry's
#                      sources), so panic locations name /build/autonode/…
#                      and /cargo/…, never this machine's paths.
#   CFLAGS             the same for C compiled by build scripts (ring's).
#
# Expects the current directory to be the checkout's root.

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || true)
  if [ -z "$SOURCE_DATE_EPOCH" ]; then
    echo "packaging: no SOURCE_DATE_EPOCH and no git commit to take it from" >&2
    exit 1
  fi
fi
export SOURCE_DATE_EPOCH

reproducible_src=$(pwd -P)
reproducible_target=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd -P)
reproducible_home=$(cd "${CARGO_HOME:-$HOME/.cargo}" 2>/dev/null && pwd -P || echo "${CARGO_HOME:-$HOME/.cargo}")
# rustc applies the last matching prefix: the target directory may lie
# inside the source directory (the default), so it comes after it.
reproducible_remap="--remap-path-prefix=$reproducible_home=/cargo --remap-path-prefix=$reproducible_src=/build/autonode --remap-path-prefix=$reproducible_target=/build/autonode/target"
reproducible_cflags="-ffile-prefix-map=$reproducible_home=/cargo -ffile-prefix-map=$reproducible_src=/build/autonode -ffile-prefix-map=$reproducible_target=/build/autonode/target"
export CFLAGS="${CFLAGS:-} $reproducible_cflags"

# Sets every file's and directory's mtime under $1 to SOURCE_DATE_EPOCH.
reproducible_touch() {
  find "$1" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
}

# Writes directory $1's contents as the tar archive $2, the same bytes for
# the same contents: names sorted, owner root, mtimes SOURCE_DATE_EPOCH,
# no atime/ctime or other per-build PAX fields.
reproducible_tar() {
  tar -C "$1" --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" -cf "$2" .
}
umask 022

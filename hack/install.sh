#!/bin/sh
# Install code-sandbox-mcp and kubectl-sandbox from a signed release
# (docs/releasing.md), on Linux or macOS:
#
#   curl -fsSL https://raw.githubusercontent.com/code-sandbox/code-sandbox-operator/main/hack/install.sh | sh
#   sh install.sh [--version vX.Y.Z] [--dir DIR] [--base-url URL] [--binaries "code-sandbox-mcp kubectl-sandbox"]
#
# It downloads the archives, checksums.txt and checksums.txt.minisig,
# verifies the signature with the public key below (with minisign if it is
# installed, else with OpenSSL >= 1.1.1, which can check minisign's Ed25519
# signatures; with neither it refuses), checks every archive's SHA-256
# against the signed list, and only then installs. Any mismatch: nothing is
# installed. Environment: CODE_SANDBOX_VERSION, CODE_SANDBOX_INSTALL_DIR,
# CODE_SANDBOX_BASE_URL, CODE_SANDBOX_LATEST_URL, CODE_SANDBOX_VERIFIER
# (minisign or openssl, to choose).
set -eu

# The release signing key: internal/release.PublicKey, docs/releasing.md.
PUBKEY="RWSpB9Y2sSncbBZRPJ5OPplFMgOFISgVZAkhu4mGPcoz48uo1o/G//8S"

REPO_URL="https://github.com/code-sandbox/code-sandbox-operator"
VERSION="${CODE_SANDBOX_VERSION:-}"
INSTALL_DIR="${CODE_SANDBOX_INSTALL_DIR:-$HOME/.local/bin}"
BASE_URL="${CODE_SANDBOX_BASE_URL:-$REPO_URL/releases/download}"
LATEST_URL="${CODE_SANDBOX_LATEST_URL:-$REPO_URL/releases/latest}"
BINARIES="${CODE_SANDBOX_BINARIES:-code-sandbox-mcp kubectl-sandbox}"
VERIFIER="${CODE_SANDBOX_VERIFIER:-}"

die() { echo "install.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--version) VERSION="${2:?--version needs a value}"; shift 2 ;;
	--dir) INSTALL_DIR="${2:?--dir needs a value}"; shift 2 ;;
	--base-url) BASE_URL="${2:?--base-url needs a value}"; shift 2 ;;
	--binaries) BINARIES="${2:?--binaries needs a value}"; shift 2 ;;
	-h | --help) sed -n '2,16p' "$0"; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

# Only https, or http to this machine (a local mirror or a test).
check_url() {
	case "$1" in
	https://*) ;;
	http://127.0.0.1[:/]* | http://localhost[:/]* | http://\[::1\][:/]*) ;;
	*) die "$1: only https URLs (or http to 127.0.0.1/localhost) are allowed" ;;
	esac
}
check_url "$BASE_URL"

case "$(uname -s)" in
Linux) os=linux ;;
Darwin) os=darwin ;;
*) die "$(uname -s) is not supported here; on Windows use hack/install.ps1" ;;
esac
case "$(uname -m)" in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*) die "architecture $(uname -m) is not released" ;;
esac

# fetch URL FILE MAXBYTES
if command -v curl >/dev/null 2>&1; then
	fetch() { curl -fsSL --proto '=https,http' --max-time 600 --max-filesize "$3" -o "$2" "$1"; }
	latest() { curl -fsSL -o /dev/null --max-time 60 -w '%{url_effective}' "$1"; }
elif command -v wget >/dev/null 2>&1; then
	fetch() { wget -q -T 600 -O "$2" "$1"; }
	latest() { wget -q -T 60 -O /dev/null -S "$1" 2>&1 | sed -n 's/^ *[Ll]ocation: *//p' | tail -n 1 | tr -d '\r'; }
else
	die "neither curl nor wget is installed"
fi

if [ -z "$VERSION" ]; then
	check_url "$LATEST_URL"
	VERSION="$(latest "$LATEST_URL")" || die "cannot find the latest release at $LATEST_URL (give --version)"
	VERSION="${VERSION##*/}"
fi
case "$VERSION" in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) die "release version \"$VERSION\" is not vX.Y.Z" ;;
esac
case "$VERSION" in
*[!0-9A-Za-z.-]*) die "release version \"$VERSION\" has unexpected characters" ;;
esac

tmp="$(mktemp -d 2>/dev/null || mktemp -d -t code-sandbox)"
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "installing $BINARIES $VERSION for $os/$arch into $INSTALL_DIR" >&2
fetch "$BASE_URL/$VERSION/checksums.txt" "$tmp/checksums.txt" 65536 || die "cannot download checksums.txt of $VERSION"
fetch "$BASE_URL/$VERSION/checksums.txt.minisig" "$tmp/checksums.txt.minisig" 4096 || die "cannot download checksums.txt.minisig of $VERSION"

b64d() { openssl base64 -d -A; }
hexof() { od -An -tx1 | tr -d ' \n'; }

# verify_openssl checks minisign's pre-hashed Ed25519 signature ("ED") of
# checksums.txt and its trusted comment, as minisign -V does.
verify_openssl() {
	sigline="$(sed -n 2p "$tmp/checksums.txt.minisig")"
	comment="$(sed -n 3p "$tmp/checksums.txt.minisig")"
	globalline="$(sed -n 4p "$tmp/checksums.txt.minisig")"
	printf '%s' "$sigline" | b64d >"$tmp/sig.bin" 2>/dev/null || return 1
	printf '%s' "$PUBKEY" | b64d >"$tmp/pub.bin" 2>/dev/null || return 1
	printf '%s' "$globalline" | b64d >"$tmp/global.bin" 2>/dev/null || return 1
	[ "$(wc -c <"$tmp/sig.bin" | tr -d ' ')" = 74 ] || return 1
	[ "$(wc -c <"$tmp/pub.bin" | tr -d ' ')" = 42 ] || return 1
	[ "$(wc -c <"$tmp/global.bin" | tr -d ' ')" = 64 ] || return 1
	# Algorithm "ED" (BLAKE2b-512 of the file, signed), and the key ID.
	[ "$(dd if="$tmp/sig.bin" bs=1 count=2 2>/dev/null | hexof)" = 4544 ] || return 1
	[ "$(dd if="$tmp/sig.bin" bs=1 skip=2 count=8 2>/dev/null | hexof)" = "$(dd if="$tmp/pub.bin" bs=1 skip=2 count=8 2>/dev/null | hexof)" ] || return 1
	dd if="$tmp/sig.bin" bs=1 skip=10 count=64 of="$tmp/ed.sig" 2>/dev/null
	# The key as a SubjectPublicKeyInfo: the Ed25519 DER prefix, then the 32 bytes.
	{
		printf '\060\052\060\005\006\003\053\145\160\003\041\000'
		dd if="$tmp/pub.bin" bs=1 skip=10 count=32 2>/dev/null
	} >"$tmp/pub.der"
	openssl pkey -pubin -inform DER -in "$tmp/pub.der" -out "$tmp/pub.pem" 2>/dev/null || return 1
	openssl dgst -blake2b512 -binary "$tmp/checksums.txt" >"$tmp/digest" || return 1
	openssl pkeyutl -verify -pubin -inkey "$tmp/pub.pem" -rawin -in "$tmp/digest" -sigfile "$tmp/ed.sig" >/dev/null 2>&1 || return 1
	case "$comment" in
	"trusted comment: "*) ;;
	*) return 1 ;;
	esac
	{
		cat "$tmp/ed.sig"
		printf '%s' "${comment#trusted comment: }"
	} >"$tmp/global.msg"
	openssl pkeyutl -verify -pubin -inkey "$tmp/pub.pem" -rawin -in "$tmp/global.msg" -sigfile "$tmp/global.bin" >/dev/null 2>&1 || return 1
	printf '%s\n' "${comment#trusted comment: }" >"$tmp/trusted"
}

verify_minisign() {
	minisign -Vm "$tmp/checksums.txt" -x "$tmp/checksums.txt.minisig" -P "$PUBKEY" >"$tmp/minisign.out" 2>&1 || return 1
	sed -n 's/^Trusted comment: //p' "$tmp/minisign.out" >"$tmp/trusted"
}

openssl_works() {
	command -v openssl >/dev/null 2>&1 &&
		openssl version 2>/dev/null | grep -q '^OpenSSL' &&
		openssl dgst -blake2b512 -binary </dev/null >/dev/null 2>&1
}

if [ -z "$VERIFIER" ]; then
	if command -v minisign >/dev/null 2>&1; then
		VERIFIER=minisign
	elif openssl_works; then
		VERIFIER=openssl
	else
		die "cannot verify the release signature: install minisign (apt install minisign, brew install minisign) or OpenSSL >= 1.1.1"
	fi
fi
case "$VERIFIER" in
minisign) verify_minisign || die "checksums.txt of $VERSION: signature verification FAILED (minisign); nothing installed" ;;
openssl) openssl_works || die "OpenSSL >= 1.1.1 is needed to verify with openssl"
	verify_openssl || die "checksums.txt of $VERSION: signature verification FAILED (openssl); nothing installed" ;;
*) die "CODE_SANDBOX_VERIFIER=$VERIFIER: want minisign or openssl" ;;
esac
# The signature vouches for one version: not an older release's list.
tr '\t' '\n' <"$tmp/trusted" | grep -qx "version:$VERSION" ||
	die "checksums.txt is signed for \"$(cat "$tmp/trusted")\", not $VERSION; nothing installed"
echo "signature of checksums.txt verified ($VERIFIER)" >&2

if command -v sha256sum >/dev/null 2>&1; then
	sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
	sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
	sha256() { openssl dgst -sha256 -r "$1" | cut -d' ' -f1; }
fi

# Download and check every archive before installing any binary.
for bin in $BINARIES; do
	case "$bin" in
	code-sandbox-mcp | kubectl-sandbox) ;;
	*) die "unknown binary $bin" ;;
	esac
	asset="${bin}_${VERSION}_${os}_${arch}.tar.gz"
	want="$(awk -v n="$asset" '$2 == n && NF == 2 { print $1 }' "$tmp/checksums.txt")"
	[ -n "$want" ] || die "checksums.txt does not list $asset"
	fetch "$BASE_URL/$VERSION/$asset" "$tmp/$asset" 268435456 || die "cannot download $asset"
	got="$(sha256 "$tmp/$asset")"
	[ "$got" = "$want" ] || die "$asset: SHA-256 $got does not match the signed $want; nothing installed"
	mkdir "$tmp/$bin.d"
	tar -xzf "$tmp/$asset" -C "$tmp/$bin.d" "$bin" || die "$asset: cannot extract $bin"
	[ -f "$tmp/$bin.d/$bin" ] && [ ! -L "$tmp/$bin.d/$bin" ] || die "$asset: $bin is not a regular file"
done

mkdir -p "$INSTALL_DIR"
for bin in $BINARIES; do
	# Into the target directory under a temporary name, then renamed.
	cp "$tmp/$bin.d/$bin" "$INSTALL_DIR/.$bin.install.$$"
	chmod 0755 "$INSTALL_DIR/.$bin.install.$$"
	mv -f "$INSTALL_DIR/.$bin.install.$$" "$INSTALL_DIR/$bin"
	echo "installed $INSTALL_DIR/$bin" >&2
done

case ":$PATH:" in
*":$INSTALL_DIR:"*) ;;
*) echo "note: $INSTALL_DIR is not on your PATH" >&2 ;;
esac
case " $BINARIES " in
*" code-sandbox-mcp "*)
	echo "MCP client configuration (code-sandbox-mcp config):" >&2
	"$INSTALL_DIR/code-sandbox-mcp" config
	;;
esac

# Install code-sandbox-mcp and kubectl-sandbox from a signed release on
# Windows (docs/releasing.md). It mirrors hack/install.sh:
#
#   powershell -ExecutionPolicy Bypass -c "irm https://raw.githubusercontent.com/code-sandbox/code-sandbox-operator/main/hack/install.ps1 | iex"
#   .\install.ps1 [-Version vX.Y.Z] [-Dir DIR] [-BaseUrl URL]
#
# It downloads the archives, checksums.txt and checksums.txt.minisig,
# verifies the signature with minisign (winget install jedisct1.minisign, or
# scoop install minisign) against the public key below, checks every
# archive's SHA-256 against the signed list, and only then installs. Windows
# has no built-in Ed25519 verifier, so without minisign it refuses. Any
# mismatch: nothing is installed.
#
# This script cannot be run by the project's CI (Linux); it is kept as
# close to install.sh as PowerShell allows, and install.sh is tested.
[CmdletBinding()]
param(
    [string]$Version = $env:CODE_SANDBOX_VERSION,
    [string]$Dir = $(if ($env:CODE_SANDBOX_INSTALL_DIR) { $env:CODE_SANDBOX_INSTALL_DIR } else { Join-Path $env:LOCALAPPDATA 'Programs\code-sandbox\bin' }),
    [string]$BaseUrl = $(if ($env:CODE_SANDBOX_BASE_URL) { $env:CODE_SANDBOX_BASE_URL } else { 'https://github.com/code-sandbox/code-sandbox-operator/releases/download' }),
    [string]$LatestUrl = $(if ($env:CODE_SANDBOX_LATEST_URL) { $env:CODE_SANDBOX_LATEST_URL } else { 'https://github.com/code-sandbox/code-sandbox-operator/releases/latest' }),
    [string[]]$Binaries = @('code-sandbox-mcp', 'kubectl-sandbox')
)
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'

# The release signing key: internal/release.PublicKey, docs/releasing.md.
$PubKey = 'RWSpB9Y2sSncbBZRPJ5OPplFMgOFISgVZAkhu4mGPcoz48uo1o/G//8S'

function Fail([string]$msg) { Write-Error "install.ps1: $msg"; exit 1 }

function Test-Url([string]$u) {
    if ($u -match '^https://' -or $u -match '^http://(127\.0\.0\.1|localhost|\[::1\])[:/]') { return }
    Fail "${u}: only https URLs (or http to 127.0.0.1/localhost) are allowed"
}
Test-Url $BaseUrl

$arch = switch ($env:PROCESSOR_ARCHITECTURE) {
    'AMD64' { 'amd64' }
    'ARM64' { 'arm64' }
    default { Fail "architecture $($env:PROCESSOR_ARCHITECTURE) is not released" }
}

$minisign = Get-Command minisign -ErrorAction SilentlyContinue
if (-not $minisign) {
    Fail 'cannot verify the release signature: install minisign first (winget install jedisct1.minisign, or scoop install minisign)'
}

if (-not $Version) {
    Test-Url $LatestUrl
    $resp = Invoke-WebRequest -Uri $LatestUrl -UseBasicParsing -MaximumRedirection 5 -TimeoutSec 60
    $Version = ($resp.BaseResponse.ResponseUri, $resp.BaseResponse.RequestMessage.RequestUri | Where-Object { $_ } | Select-Object -First 1).Segments[-1]
}
if ($Version -notmatch '^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$') { Fail "release version '$Version' is not vX.Y.Z" }

$tmp = Join-Path ([System.IO.Path]::GetTempPath()) ("code-sandbox-install-" + [guid]::NewGuid())
New-Item -ItemType Directory -Path $tmp | Out-Null
try {
    Write-Host "installing $($Binaries -join ' ') $Version for windows/$arch into $Dir"
    function Get-File([string]$name, [long]$max) {
        $out = Join-Path $tmp $name
        Invoke-WebRequest -Uri "$BaseUrl/$Version/$name" -OutFile $out -UseBasicParsing -TimeoutSec 600
        if ((Get-Item $out).Length -gt $max) { Fail "$name is larger than $max bytes" }
        return $out
    }
    $sums = Get-File 'checksums.txt' 65536
    $sig = Get-File 'checksums.txt.minisig' 4096

    $verify = & $minisign.Source -Vm $sums -x $sig -P $PubKey 2>&1
    if ($LASTEXITCODE -ne 0) { Fail "checksums.txt of ${Version}: signature verification FAILED; nothing installed" }
    $trusted = ($verify | Where-Object { $_ -like 'Trusted comment: *' }) -replace '^Trusted comment: ', ''
    if (-not (($trusted -split "`t") -contains "version:$Version")) {
        Fail "checksums.txt is signed for '$trusted', not $Version; nothing installed"
    }
    Write-Host 'signature of checksums.txt verified (minisign)'

    $staged = @{}
    foreach ($bin in $Binaries) {
        if ($bin -notin @('code-sandbox-mcp', 'kubectl-sandbox')) { Fail "unknown binary $bin" }
        $asset = "${bin}_${Version}_windows_${arch}.zip"
        $line = Get-Content $sums | Where-Object { ($_ -split '  ', 2)[1] -ceq $asset }
        if (-not $line) { Fail "checksums.txt does not list $asset" }
        $want = ($line -split '  ', 2)[0]
        $zip = Get-File $asset 268435456
        $got = (Get-FileHash -Algorithm SHA256 $zip).Hash.ToLowerInvariant()
        if ($got -ne $want) { Fail "${asset}: SHA-256 $got does not match the signed $want; nothing installed" }
        $dest = Join-Path $tmp "$bin.d"
        Expand-Archive -Path $zip -DestinationPath $dest
        $exe = Join-Path $dest "$bin.exe"
        if (-not (Test-Path -PathType Leaf $exe)) { Fail "${asset}: no $bin.exe" }
        $staged[$bin] = $exe
    }

    New-Item -ItemType Directory -Force -Path $Dir | Out-Null
    foreach ($bin in $Binaries) {
        $target = Join-Path $Dir "$bin.exe"
        $incoming = "$target.install"
        Copy-Item $staged[$bin] $incoming -Force
        # A running executable cannot be replaced, only renamed: move it aside.
        if (Test-Path $target) { Move-Item -Force $target "$target.old" }
        Move-Item -Force $incoming $target
        Write-Host "installed $target"
    }

    $userPath = [Environment]::GetEnvironmentVariable('Path', 'User')
    if (-not (($userPath -split ';') -contains $Dir)) {
        [Environment]::SetEnvironmentVariable('Path', "$userPath;$Dir", 'User')
        Write-Host "added $Dir to your user PATH (new terminals see it)"
    }
    if ($Binaries -contains 'code-sandbox-mcp') {
        Write-Host 'MCP client configuration (code-sandbox-mcp config):'
        & (Join-Path $Dir 'code-sandbox-mcp.exe') config
    }
}
finally {
    Remove-Item -Recurse -Force $tmp -ErrorAction SilentlyContinue
}

#!/usr/bin/env bash
# Re-vendor Chart.js for the dashboard from the npm registry: the UMD build, its licence, and a README with
# name, version, licence and checksum. Usage: tools/vendor_chartjs.sh [VERSION]   (default: the pinned one)
set -euo pipefail
VERSION=${1:-4.6.1}
DEST="$(cd "$(dirname "$0")/.." && pwd)/neuronfrontier/static/vendor"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "chart.js@$VERSION" >/dev/null && tar xzf chart.js-"$VERSION".tgz)
mkdir -p "$DEST"
cp "$tmp/package/dist/chart.umd.min.js" "$DEST/chart.umd.min.js"
cp "$tmp/package/LICENSE.md" "$DEST/chart.js-LICENSE.md"
licence=$(node -p "require('$tmp/package/package.json').license")
sha=$(sha256sum "$DEST/chart.umd.min.js" | cut -d' ' -f1)
cat > "$DEST/README.md" <<MD
# Vendored front-end libraries

The dashboard works offline: nothing is loaded from a CDN. Files here come unmodified from the npm registry.

| file | package | version | licence | from |
|---|---|---|---|---|
| \`chart.umd.min.js\` | chart.js | $VERSION | $licence (\`chart.js-LICENSE.md\`) | \`dist/chart.umd.min.js\` of \`npm pack chart.js@$VERSION\` |

sha256 of \`chart.umd.min.js\`: \`$sha\`

Re-vendor (or upgrade) with \`tools/vendor_chartjs.sh [VERSION]\`.
MD
echo "vendored chart.js $VERSION ($licence) into $DEST"

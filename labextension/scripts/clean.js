// Removes the given build outputs (paths relative to this package); what
// `jlpm clean` runs before a production build. Plain Node, no dependency.
const fs = require('fs');
const path = require('path');

for (const target of process.argv.slice(2)) {
  fs.rmSync(path.resolve(__dirname, '..', target), { recursive: true, force: true });
}
fs.rmSync(path.resolve(__dirname, '..', 'tsconfig.tsbuildinfo'), { force: true });

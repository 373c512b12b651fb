// Sluice packaging plugin for osls: one source of dependencies, lean functions, fast packaging.
//
// 1. Writes the Lambda requirements file from the lock (`custom.packaging.lock`:
//    infra/requirements.lock here, the app's own requirements.lock in an app's deployment),
//    every distribution pinned as locked, leaving out `custom.packaging.localOnly`
//    (`sluice dev` and `sluice generate` only) and what only they need, read from the lock's
//    `# via` notes (click, there only for uvicorn). The lock's `--find-links` lines (an
//    app's lock names the folder with Sluice's wheel) are kept, made absolute. pyproject.toml
//    stays where dependencies are declared; the lock is compiled from it (`uv pip compile`,
//    see its header) and a test checks the two agree (tests/unit/test_lock.py).
// 2. Runs serverless-python-requirements' install step with `custom.pythonRequirements`
//    (pip, manylinux wheels for Python 3.12, no Docker), cached by the plugin per
//    requirements checksum.
// 3. After osls has zipped each function (package.individually), puts the installed
//    dependencies into each zip through inject_deps.py (zlib in C: about a second per
//    function, where the plugin's own JSZip injection took half a minute). Each entry of
//    `custom.packaging.only` names distributions and paths that ship only with the functions
//    whose handler module it lists (`http`: FastAPI and the console; `http` and `cron`: the
//    admin token verification's cryptography), and `custom.packaging.neverShipped` paths no
//    function loads (test suites inside wheels, stubs), so each function's package holds
//    only what it imports. With an interpreter of the runtime's version at hand
//    (`custom.packaging.bytecodePython`, python3.12 on PATH, or pyenv's), every module ships
//    with its .pyc, which Lambda's read-only filesystem cannot cache.
//
// serverless-python-requirements is driven from here rather than listed under `plugins:`,
// so that its own hooks do not inject the wheels a second time, slowly. `osls deploy
// function -f NAME` goes through the same two steps for that one function.
'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const path = require('path');
const PythonRequirements = require('serverless-python-requirements');

// A lock line pins one distribution: `name==version`, or `name @ url` (a wheel of the app's
// own, or Sluice's, by its file or URL), perhaps with a marker; comments carry nothing to
// install, except uv's `# via` notes, which say what needs each pin.
const PINNED = /^([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)\s*(==\s*[^\s;#]+|@\s*[^\s;#]+)\s*(;[^#]*)?/;
const VIA = /^\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)/;
const FIND_LINKS = /^(?:--find-links|-f)[\s=]+(\S+)\s*$/;

const norm = (s) => s.toLowerCase().replace(/[-.]+/g, '_');

function distributionName(requirement) {
  return norm(requirement.split(/[\s[<>=!~;@]/, 1)[0]);
}

// The lock's pins, each with the distributions its `# via` notes name, and its
// `--find-links` folders.
function readLock(text) {
  const pins = [];
  const findLinks = [];
  let current = null;
  text.split('\n').forEach((line) => {
    const pinned = line.match(PINNED);
    const links = line.match(FIND_LINKS);
    if (pinned) {
      current = {
        name: distributionName(pinned[1]),
        requirement: `${pinned[1]}${pinned[2].startsWith('@') ? ` ${pinned[2]}` : pinned[2]}` +
          `${pinned[3] ? ` ${pinned[3].trim()}` : ''}`,
        via: [],
      };
      pins.push(current);
    } else if (links) {
      findLinks.push(links[1]);
    } else if (current && /^\s+#/.test(line) && !/^\s+#\s+via\s*$/.test(line)) {
      const via = line.match(VIA);
      if (via) current.via.push(distributionName(via[1]));
    } else if (!/^\s+#/.test(line)) {
      current = null;
    }
  });
  return { pins, findLinks };
}

// `localOnly` and every pin that only they need: a pin is left out when the lock names what
// needs it and all of that is left out (a pin the lock says nothing about stays).
function leftOut(pins, localOnly) {
  const out = new Set(localOnly.map(distributionName));
  let grew = true;
  while (grew) {
    grew = false;
    pins.forEach((pin) => {
      if (!out.has(pin.name) && pin.via.length && pin.via.every((v) => out.has(v))) {
        out.add(pin.name);
        grew = true;
      }
    });
  }
  return out;
}

function versionOf(python) {
  try {
    return childProcess.execFileSync(
      python, ['-c', 'import sys; print("python%d.%d" % sys.version_info[:2])'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }
    ).trim();
  } catch (error) {
    return null;
  }
}

// An interpreter of the Lambda runtime's version, to compile bytecode with: the configured
// one, else pythonX.Y on PATH, else a pyenv-installed X.Y.
function runtimePython(runtime, configured) {
  const version = runtime.replace(/^python/, '');
  const candidates = [configured, runtime].filter(Boolean);
  try {
    const root = childProcess.execFileSync('pyenv', ['root'], {
      encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    const installed = fs.readdirSync(path.join(root, 'versions'))
      .filter((v) => v === version || v.startsWith(`${version}.`)).sort().reverse();
    candidates.push(...installed.map((v) => path.join(root, 'versions', v, 'bin', runtime)));
  } catch (error) {
    // no pyenv: only PATH counts
  }
  return candidates.find((python) => versionOf(python) === runtime) || null;
}

class SluicePackaging {
  constructor(serverless, cliOptions, utils) {
    this.serverless = serverless;
    this.cliOptions = cliOptions;
    this.utils = utils;
    this.log = utils.log;
    this.hooks = {
      'before:package:createDeploymentArtifacts': () => this.installDependencies(),
      'after:package:createDeploymentArtifacts': () => this.injectDependencies(),
      'before:deploy:function:packageFunction': () => this.installDependencies(),
      'after:deploy:function:packageFunction': () => this.injectDependencies(),
    };
  }

  get config() {
    return (this.serverless.service.custom && this.serverless.service.custom.packaging) || {};
  }

  fail(message) {
    throw new this.serverless.classes.Error(`sluice packaging: ${message}`);
  }

  writeRequirements() {
    const serviceDir = this.serverless.serviceDir;
    const lock = path.join(serviceDir, this.config.lock || 'requirements.lock');
    if (!fs.existsSync(lock)) this.fail(`no lock file at ${lock} (custom.packaging.lock)`);
    const { pins, findLinks } = readLock(fs.readFileSync(lock, 'utf8'));
    if (!pins.length) this.fail(`${lock} pins no distribution`);
    const out = leftOut(pins, this.config.localOnly || []);
    const keep = pins.filter((pin) => !out.has(pin.name)).map((pin) => pin.requirement);
    // pip reads a relative --find-links from where it runs, not from the lock's folder
    const links = findLinks.map((link) => (/^[a-z]+:\/\//.test(link) ? link
      : path.resolve(path.dirname(lock), link)));
    const target = path.join(serviceDir, '.serverless', 'sluice-requirements.txt');
    fs.mkdirSync(path.dirname(target), { recursive: true });
    fs.writeFileSync(target, [...links.map((l) => `--find-links ${l}`), ...keep].join('\n') + '\n');
    const dropped = pins.filter((pin) => out.has(pin.name)).map((pin) => pin.name);
    this.log.info(`sluice: ${keep.length} Lambda requirements pinned by ${path.basename(lock)}` +
      `${dropped.length ? ` (left out: ${dropped.join(', ')})` : ''}`);
  }

  async installDependencies() {
    this.writeRequirements();
    const python = new PythonRequirements(this.serverless, this.cliOptions, this.utils);
    await python.hooks['requirements:install:install']();
  }

  injectDependencies() {
    const service = this.serverless.service;
    const installed = path.join(this.serverless.serviceDir, '.serverless', 'requirements');
    if (!fs.existsSync(installed)) this.fail(`no requirements were installed at ${installed}`);
    const names = this.cliOptions.function ? [this.cliOptions.function] : service.getAllFunctions();
    const functions = names.map((name) => {
      const fn = service.getFunction(name);
      const artifact = fn.package && fn.package.artifact;
      if (!artifact) this.fail(`function ${name} has no artifact; set package.individually: true`);
      // the handler's module file names its kind: functions/http.handler -> http
      const kind = String(fn.handler || '').replace(/\.[^./]+$/, '').split('/').pop();
      return { name, artifact, kind };
    });
    const runtime = service.provider.runtime;
    const compiler = runtimePython(runtime, this.config.bytecodePython);
    if (!compiler) {
      this.log.warning(
        `sluice: no ${runtime} interpreter found (set SLUICE_BYTECODE_PYTHON): the packages ` +
          'ship without bytecode, so every cold start compiles every module it imports'
      );
    }
    const spec = {
      installed,
      runtime,
      bytecode: Boolean(compiler),
      noDeploy: (service.custom.pythonRequirements || {}).noDeploy || [],
      only: this.config.only || [],
      neverShipped: this.config.neverShipped || [],
      sourceRoot: this.config.sourceRoot || '',
      functions,
    };
    const out = childProcess.execFileSync(
      compiler || this.config.python || 'python3', [path.join(__dirname, 'inject_deps.py')],
      { input: JSON.stringify(spec), encoding: 'utf8' }
    );
    out.trim().split('\n').forEach((line) => this.log.info(`sluice: ${line}`));
  }
}

module.exports = SluicePackaging;

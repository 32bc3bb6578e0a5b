//! Finds libflashcore and tells rustc how to link it. Compiles nothing.
//!
//! Order of search:
//! 1. `FLASHCORE_LIB_DIR`: a folder holding `libflashcore.so` (a CMake build
//!    folder or an install's lib folder).
//! 2. `pkg-config --libs flashcore` (the command named by `PKG_CONFIG`, else
//!    `pkg-config`), which honours `PKG_CONFIG_PATH` for non-system prefixes.
//! 3. Otherwise a plain `-lflashcore`, with a warning: enough when the library
//!    is in the linker's default path, and harmless for `cargo doc`/`check`.

use std::env;
use std::process::Command;

const LIB: &str = "flashcore";
const MIN_VERSION: &str = "0.9.0";

fn main() {
    for var in ["FLASHCORE_LIB_DIR", "PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    if let Some(dir) = env::var_os("FLASHCORE_LIB_DIR") {
        let dir = dir.to_string_lossy().into_owned();
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-lib=dylib={LIB}");
        println!("cargo:lib_dir={dir}");
        return;
    }
    match pkg_config_libs() {
        Ok(flags) => emit_pkg_config_flags(&flags),
        Err(why) => {
            println!(
                "cargo:warning=flashcore-sys: {why}; linking with a plain -l{LIB}. \
                 Set FLASHCORE_LIB_DIR or PKG_CONFIG_PATH if the link fails."
            );
            println!("cargo:rustc-link-lib=dylib={LIB}");
        }
    }
}

/// Runs `pkg-config --libs "flashcore >= MIN_VERSION"` and returns its output.
fn pkg_config_libs() -> Result<String, String> {
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_owned());
    let output = Command::new(&pkg_config)
        .arg("--libs")
        .arg(format!("{LIB} >= {MIN_VERSION}"))
        .output()
        .map_err(|e| format!("could not run `{pkg_config}` ({e})"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("`{pkg_config} --libs {LIB}` failed: {}", stderr.trim()));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("`{pkg_config}` printed non-UTF-8 output"))
}

/// Turns `-L` and `-l` flags into cargo link lines; anything else is reported.
fn emit_pkg_config_flags(flags: &str) {
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:lib_dir={dir}");
        } else if let Some(name) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={name}");
        } else {
            println!("cargo:warning=flashcore-sys: ignoring pkg-config flag `{flag}`");
        }
    }
}

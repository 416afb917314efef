//! The module graph of the common crate (and of the service crate) points one way: no top-level module of
//! `shared/src` uses another that uses it back (directly or through others).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// A file's code without its tests and comments.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap();
    code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The first names `code` reaches through `prefix` (`crate::`, `super::`):
/// `prefix x::...` paths, and the first names of `use prefix{x::..., y, ...}` trees.
fn reached(code: &str, prefix: &str, out: &mut BTreeSet<String>) {
    for (i, _) in code.match_indices(prefix) {
        // `super::super::` is not a sibling; `crate::` inside a longer path is not the crate.
        let before = code[..i].chars().next_back().unwrap_or(' ');
        if before.is_ascii_alphanumeric() || before == '_' || before == ':' {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(tree) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in tree.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(first_name(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.insert(first_name(&item));
        } else {
            out.insert(first_name(rest));
        }
    }
}

/// The `.rs` files under `dir` (test modules' files aside), each with the child of `dir` it belongs to.
fn files_by_child(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
                let child = path.strip_prefix(dir).unwrap().components().next().unwrap();
                files.push((child.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string(), path));
            }
        }
    }
    files
}

/// The edges between the children of the module at `dir` (`module`, as
/// `crate::` names it; empty for the crate): which uses which, through
/// `crate::module::x` anywhere below and `super::x` in a child's own file.
fn edges(dir: &Path, module: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let crate_prefix = if module.is_empty() { "crate::".to_string() } else { format!("crate::{module}::") };
    for (child, path) in files_by_child(dir) {
        if matches!(child.as_str(), "lib" | "mod") {
            continue;
        }
        let code = code_of(&path);
        let used = out.entry(child.clone()).or_default();
        reached(&code, &crate_prefix, used);
        let own_file = path.parent() == Some(dir)
            || path.file_name().is_some_and(|f| f == "mod.rs") && path.parent().and_then(|p| p.parent()) == Some(dir);
        if !module.is_empty() && own_file {
            reached(&code, "super::", used);
        }
        used.remove(&child);
    }
    let children: BTreeSet<String> = out.keys().cloned().collect();
    out.values_mut().for_each(|used| used.retain(|m| children.contains(m)));
    out
}

fn first_name(s: &str) -> String {
    s.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// A path of edges from a module back to itself, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn back(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, path: &mut Vec<String>) -> Option<Vec<String>> {
        for next in graph.get(from).into_iter().flatten() {
            if let Some(i) = path.iter().position(|p| p == next) {
                let mut cycle = path[i..].to_vec();
                cycle.push(next.clone());
                return Some(cycle);
            }
            path.push(next.clone());
            if let Some(cycle) = back(graph, next, path) {
                return Some(cycle);
            }
            path.pop();
        }
        None
    }
    graph.keys().find_map(|start| back(graph, start, &mut vec![start.clone()]))
}

#[test]
fn the_common_crate_has_no_import_cycle_between_its_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src");
    let graph = edges(&src, "");
    assert!(graph.contains_key("core") && graph.contains_key("receive"), "{graph:?}");
    assert!(graph["core"].is_empty(), "core is the leaf: {:?}", graph["core"]);
    if let Some(cycle) = cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
    let service = edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../service/src"), "");
    assert!(service.contains_key("dev") && service.contains_key("serve"), "{service:?}");
    if let Some(cycle) = cycle(&service) {
        panic!("import cycle in the service crate: {}", cycle.join(" -> "));
    }
}

/// Within every folder of the library and the service crate too: no module uses a sibling that
/// uses it back (through `super::` or `crate::` paths).
#[test]
fn no_folder_of_the_common_crate_has_an_import_cycle_between_its_modules() {
    let mut checked = 0;
    for src in
        ["../shared/src", "../service/src", "../console/src"].map(|s| Path::new(env!("CARGO_MANIFEST_DIR")).join(s))
    {
        let mut folders = vec![src.clone()];
        while let Some(dir) = folders.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                }
            }
            if dir == src {
                continue;
            }
            let module = dir.strip_prefix(&src).unwrap().to_string_lossy().replace('/', "::");
            let graph = edges(&dir, &module);
            if let Some(cycle) = cycle(&graph) {
                panic!("import cycle in {module}: {}", cycle.join(" -> "));
            }
            checked += 1;
        }
    }
    assert!(checked >= 14, "{checked} folders");
}

/// docs/build-your-own.md and the README quote the example application: each
/// Rust block names a file of `examples/` (`// examples/invoices/...` on its
/// first line) and is found in that file, line for line, so every snippet they
/// show is compiled and tested code.
#[test]
fn the_build_your_own_page_quotes_the_example_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |page: &str| std::fs::read_to_string(root.join(page)).unwrap();
    let pages = read("docs/build-your-own.md") + &read("README.md");
    let mut quoted = 0;
    for block in pages.split("```rust\n").skip(1) {
        let block = block.split("```").next().unwrap();
        let (first, code) = block.split_once('\n').unwrap();
        let file = first.strip_prefix("// ").unwrap_or_else(|| panic!("a Rust block that names no file: {first}"));
        assert!(file.starts_with("examples/"), "{file}");
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(code), "a snippet quotes {file}, which no longer reads:\n{code}");
        quoted += 1;
    }
    assert!(quoted >= 7, "{quoted} blocks");
}

/// Every `.rs` file of the repository, the build's output and the npm packages aside.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | "node_modules" | ".git") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// `rustfmt --check` on each file by itself, not through `cargo fmt`, which
/// skips what it cannot reach by plain `mod` items (a module declared inside a
/// macro, a file no crate names): no way of declaring a module hides a file.
#[test]
fn every_rust_file_of_the_repository_is_formatted() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&repo, &mut files);
    assert!(files.len() > 100, "the repository's files were found: {}", files.len());
    assert!(
        files.iter().any(|f| f.ends_with("shared/src/db/inbox/claim.rs")),
        "the library's internal modules included"
    );
    let out = std::process::Command::new("rustfmt")
        .args(["--edition", "2021", "--check"])
        .args(&files)
        .current_dir(&repo)
        .output()
        .expect("rustfmt runs (rustup component add rustfmt)");
    let said = String::from_utf8_lossy(&out.stdout);
    let unformatted: Vec<&str> = said.lines().filter_map(|l| l.strip_prefix("Diff in ")).collect();
    assert!(
        out.status.success(),
        "not formatted (cargo fmt, or rustfmt FILE): {unformatted:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The house's size: no Rust file of the repository is over 600 lines, a
/// file's unit tests aside (what follows its `#[cfg(test)]`, or a `tests.rs`
/// module of their own); the integration suites are held to it too. A file
/// that outgrows it is split by what it holds.
#[test]
fn no_rust_file_is_over_600_lines_its_unit_tests_aside() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&repo, &mut files);
    let unit_tests = |f: &Path| f.ends_with("tests.rs");
    let mut over: Vec<String> = files
        .iter()
        .filter(|f| !unit_tests(f))
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let lines = text.lines().take_while(|l| l.trim() != "#[cfg(test)]").count();
            (lines > 600).then(|| format!("{} ({lines})", f.strip_prefix(&repo).unwrap().display()))
        })
        .collect();
    over.sort();
    assert!(files.len() > 100 && over.is_empty(), "over 600 lines: {over:?}");
}

/// docs/layout.md against the tree: each path it names at the start of a
/// line exists, and every folder of `shared/src` and `schemes/src` and every
/// entry at the top of the repository is named.
#[test]
fn the_layout_page_names_every_folder_and_only_what_exists() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(repo.join("docs/layout.md")).unwrap();
    let folders_section = page.split("## Folders").nth(1).expect("the layout's Folders section");
    let block = folders_section.split("```").nth(1).expect("the layout's block");
    let named: BTreeSet<String> = block
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap().trim_end_matches('/').to_string())
        .collect();
    for path in &named {
        assert!(repo.join(path).exists(), "docs/layout.md names {path}, which is not in the tree");
    }
    let mut folders =
        vec![repo.join("shared/src"), repo.join("schemes/src"), repo.join("service/src"), repo.join("console/src")];
    let mut i = 0;
    while i < folders.len() {
        for entry in std::fs::read_dir(&folders[i]).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            }
        }
        i += 1;
    }
    for folder in folders {
        let rel = folder.strip_prefix(&repo).unwrap().to_string_lossy().into_owned();
        assert!(named.contains(&rel), "docs/layout.md does not name {rel}/");
    }
    for entry in std::fs::read_dir(&repo).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || matches!(name.as_str(), "target" | "Cargo.lock" | "rustfmt.toml") {
            continue;
        }
        let named_here = named.iter().any(|n| n == &name || n.starts_with(&format!("{name}/")));
        assert!(named_here, "docs/layout.md does not name {name}");
    }
}

/// The variables the code reads by name (through `Env`'s readers), from its sources.
fn variables_read(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            variables_read(&path, out);
            continue;
        }
        if path.extension().map_or(true, |e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for reader in [".var(\"", ".parse(\"", ".positive(\"", ".millis(\"", " ms(\""] {
            for rest in text.split(reader).skip(1) {
                let name: String =
                    rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
                if name.len() > 2 && rest[name.len()..].starts_with('"') {
                    out.insert(name);
                }
            }
        }
    }
}

/// docs/configuration.md against the code, both ways: every variable the
/// code reads by name is on the page, and every variable its table names is
/// read somewhere (a `<NAME>` pattern aside).
#[test]
fn the_configuration_page_names_every_variable_the_code_reads_and_only_those() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(repo.join("docs/configuration.md")).unwrap();
    let table: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(" | ").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
        .filter(|v| v.len() > 2 && v.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .collect();
    assert!(table.len() > 50, "the table was read: {table:?}");
    let mut read = BTreeSet::new();
    variables_read(&repo.join("shared/src"), &mut read);
    variables_read(&repo.join("functions"), &mut read);
    variables_read(&repo.join("inbox/src"), &mut read);
    variables_read(&repo.join("service/src"), &mut read);
    variables_read(&repo.join("console/src"), &mut read);
    // Outside the table: the examples' and tests' own.
    read.remove("ACME_WEBHOOK_SECRET");
    let undocumented: Vec<&String> =
        read.iter().filter(|v| !table.contains(*v) && !page.contains(&format!("`{v}`"))).collect();
    assert!(undocumented.is_empty(), "read by the code, not in docs/configuration.md: {undocumented:?}");
    let mut sources = String::new();
    for dir in ["shared/src", "functions", "inbox/src", "service/src", "console/src"] {
        let mut files = Vec::new();
        rust_files(&repo.join(dir), &mut files);
        files.iter().for_each(|f| sources.push_str(&std::fs::read_to_string(f).unwrap()));
    }
    let unread: Vec<&String> = table.iter().filter(|v| !sources.contains(&format!("\"{v}"))).collect();
    assert!(unread.is_empty(), "in docs/configuration.md, never read by the code: {unread:?}");
}

/// The workspace's crates in layers, each of whose normal dependencies is
/// in a layer below it: the schemes and the migrations, the common crate, the
/// stock application and the console, the service (serve, dev), what runs it (the functions, `inbox`, a team's example),
/// what measures and tests them. A crate added to the workspace is placed here.
const LAYERS: &[&[&str]] = &[
    // common-deps and check-deps have no code: the functions' and the checks' shared dependencies' features.
    &["webhook-inbox-schemes", "webhook-inbox-migrations", "common-deps", "check-deps"],
    &["webhook-inbox"],
    &["stock", "webhook-inbox-console"],
    &["webhook-inbox-service"],
    &["receive", "process", "relay", "prune", "reconcile", "migrate", "inbox", "invoices"],
    &["inbox-tests", "inbox-bench"],
];

/// The Lambda functions: none links the service crate or the console.
const FUNCTIONS: &[&str] = &["receive", "process", "relay", "prune", "reconcile", "migrate"];

/// What the schemes crate must never link: an async runtime, a database, a
/// web framework, an AWS SDK (it is what a proxy or a fuzz target builds).
const NOT_IN_SCHEMES: &[&str] = &["tokio", "sqlx", "hyper", "axum", "reqwest", "aws-config", "lambda_http"];

/// Dependencies point one way, read from `cargo metadata`: every normal
/// dependency between the workspace's crates goes down `LAYERS`, and the
/// schemes crate's whole dependency tree is free of `NOT_IN_SCHEMES`.
#[test]
fn dependencies_point_one_way() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let members: BTreeSet<&str> =
        meta["workspace_members"].as_array().unwrap().iter().map(|id| name_of[id.as_str().unwrap()]).collect();
    let layer = |name: &str| LAYERS.iter().position(|l| l.contains(&name));
    for m in &members {
        assert!(layer(m).is_some(), "{m} is in the workspace but not in LAYERS (tests/it/layout.rs)");
    }
    // Each package's normal dependencies, as resolved.
    let mut normal: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"].as_array().unwrap().iter().filter(|d| {
            d["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null() && k["target"].is_null())
        });
        normal
            .insert(name_of[node["id"].as_str().unwrap()], deps.map(|d| name_of[d["pkg"].as_str().unwrap()]).collect());
    }
    let mut wrong = Vec::new();
    for m in &members {
        for dep in normal[m].iter().filter(|d| members.contains(*d)) {
            if layer(dep) >= layer(m) {
                wrong.push(format!("{m} -> {dep}"));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies that do not point down the layers: {wrong:?}");
    let (mut seen, mut todo) = (BTreeSet::new(), vec!["webhook-inbox-schemes"]);
    while let Some(p) = todo.pop() {
        if seen.insert(p) {
            todo.extend(normal[p].iter().copied());
        }
    }
    let linked: Vec<&&str> = NOT_IN_SCHEMES.iter().filter(|n| seen.contains(**n)).collect();
    assert!(seen.len() > 10 && linked.is_empty(), "the schemes crate links {linked:?}");
    // No Lambda function reaches the service crate (its HTTP server and exporter) or the console, at any depth.
    for function in FUNCTIONS {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![*function]);
        while let Some(p) = todo.pop() {
            if seen.insert(p) {
                todo.extend(normal[p].iter().copied());
            }
        }
        assert!(seen.contains("webhook-inbox"), "{function}'s tree was read: {seen:?}");
        for apart in ["webhook-inbox-service", "webhook-inbox-console"] {
            assert!(!seen.contains(apart), "the function {function} links {apart}");
        }
    }
}

/// Receive runs handlers inline through a trait the process stage implements
/// (`receive::claim::inline::InlineHandlers`): no file of receive names the
/// process stage.
#[test]
fn receive_does_not_depend_on_the_process_stage() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src/receive"), &mut files);
    assert!(!files.is_empty());
    for file in files {
        let code = code_of(&file);
        assert!(!code.contains("process::"), "{} names the process stage", file.display());
    }
}

/// `pub` means public: every crate of the workspace takes `[workspace.lints]`
/// (missing_docs, unreachable_pub), but those named here, each with why.
const WITHOUT_THE_WORKSPACE_LINTS: &[(&str, &str)] = &[
    ("tests", "test support, not an API"),
    ("examples/invoices", "a team's application, written as a team would"),
    ("functions/common-deps", "no code"),
    ("tests/check-deps", "no code"),
];

#[test]
fn every_crate_takes_the_workspace_lints_but_the_named_ones() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let members = root.lines().find(|l| l.starts_with("members")).expect("the workspace's members");
    let members: Vec<&str> = members.split('"').skip(1).step_by(2).collect();
    assert!(members.len() > 10, "{members:?}");
    let mut without = Vec::new();
    for member in &members {
        let manifest = std::fs::read_to_string(repo.join(member).join("Cargo.toml")).unwrap();
        let takes = manifest.contains("[lints]\nworkspace = true");
        let excused = WITHOUT_THE_WORKSPACE_LINTS.iter().any(|(m, _)| m == member);
        assert!(!(takes && excused), "{member} takes the workspace's lints: take it off WITHOUT_THE_WORKSPACE_LINTS");
        if !takes && !excused {
            without.push(*member);
        }
    }
    assert!(without.is_empty(), "without [lints] workspace = true: {without:?}");
}

#!/usr/bin/env python3
"""Counts the public API items of a crate from its rustdoc JSON.

The rule, calibrated on the pre-split crate (commit b2dd609, all
features), whose "about 450 public items" (issue 33) it gives as 449:

* Start at the crate's root module and follow every public item it makes
  reachable: the items of public modules and whatever `pub use` re-exports
  (a glob re-export brings the module's items). An item reachable by two
  paths (`tower_admission::RankHeader` and `tower_admission::http::RankHeader`)
  counts once. Items of other crates that are re-exported are not counted.
* Counted, one each: structs, enums, unions, traits, free functions,
  constants, statics, type aliases, macros, and the **inherent**
  associated functions (methods and constructors) and associated
  constants of those structs, enums and unions.
* Not counted: modules (paths, not items), the items a trait declares (a
  trait counts once, with its methods), enum variants, struct fields,
  trait implementations, and anything rustdoc hides (`#[doc(hidden)]`,
  private items).

`--all` counts modules and the items traits declare too (the wider rule:
472 for b2dd609); `--variants` adds enum variants and public struct fields.

Usage, from the repository root:

    RUSTC_BOOTSTRAP=1 cargo rustdoc -p tower-admission --all-features --lib \\
        -- -Z unstable-options --output-format json
    python3 scripts/api_items.py target/doc/tower_admission.json [--list] [--all]

`--list` prints every counted item with its path. Written against rustdoc
JSON `format_version` 57 (Rust 1.95).
"""

import argparse
import collections
import json
import sys

TOP_KINDS = {
    "module",
    "struct",
    "enum",
    "union",
    "trait",
    "function",
    "constant",
    "static",
    "type_alias",
    "macro",
    "proc_macro",
    "trait_alias",
}


def kind_of(item):
    inner = item["inner"]
    return next(iter(inner)) if isinstance(inner, dict) else inner


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="target/doc/<crate>.json")
    parser.add_argument("--list", action="store_true", help="print each counted item")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also count modules and the items traits declare",
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also count enum variants and public struct fields",
    )
    args = parser.parse_args()

    with open(args.json) as file:
        doc = json.load(file)
    index = doc["index"]

    def item(id_):
        return index.get(str(id_))

    counted = {}  # id -> (kind, path)

    def count(id_, kind, path, trait_item=False):
        if not args.all and (kind == "module" or trait_item):
            return
        if id_ not in counted:
            counted[id_] = (kind, path)

    def public(entry):
        return entry.get("visibility") in ("public", "default")

    def walk_type(entry, path, kind):
        inner = entry["inner"][kind]
        for impl_id in inner.get("impls", []):
            impl_ = item(impl_id)
            if impl_ is None:
                continue
            body = impl_["inner"]["impl"]
            if body["trait"] is not None or body["is_synthetic"] or body["blanket_impl"]:
                continue
            for member_id in body["items"]:
                member = item(member_id)
                if member is None or not public(member):
                    continue
                member_kind = kind_of(member)
                if member_kind in ("function", "assoc_const"):
                    count(member_id, member_kind, f"{path}::{member['name']}")
        if args.variants:
            if kind == "enum":
                for variant_id in inner["variants"]:
                    variant = item(variant_id)
                    count(variant_id, "variant", f"{path}::{variant['name']}")
            if kind == "struct":
                fields = inner["kind"]
                listed = []
                if isinstance(fields, dict) and "plain" in fields:
                    listed = fields["plain"]["fields"]
                elif isinstance(fields, dict) and "tuple" in fields:
                    listed = [f for f in fields["tuple"] if f is not None]
                for field_id in listed:
                    field = item(field_id)
                    if field is not None and public(field):
                        count(field_id, "field", f"{path}.{field['name']}")

    seen_modules = set()

    def walk(id_, path):
        entry = item(id_)
        if entry is None:  # another crate's item
            return
        kind = kind_of(entry)
        if kind == "use":
            use = entry["inner"]["use"]
            if use["id"] is None:
                return
            target = item(use["id"])
            if target is None:
                return
            if use["is_glob"]:
                if kind_of(target) == "module" and use["id"] not in seen_modules:
                    seen_modules.add(use["id"])
                    for child in target["inner"]["module"]["items"]:
                        walk(child, path)
                return
            walk(use["id"], f"{path}::{use['name']}")
            return
        if kind not in TOP_KINDS:
            return
        if kind != "module" or id_ == doc["root"] or entry.get("name"):
            count(id_, kind, path if id_ != doc["root"] else entry["name"])
        if kind == "module":
            if id_ in seen_modules:
                return
            seen_modules.add(id_)
            for child in entry["inner"]["module"]["items"]:
                child_entry = item(child)
                if child_entry is None:
                    continue
                name = child_entry.get("name") or ""
                walk(child, f"{path}::{name}" if kind_of(child_entry) != "use" else path)
        elif kind in ("struct", "enum", "union"):
            walk_type(entry, path, kind)
        elif kind == "trait":
            for member_id in entry["inner"]["trait"]["items"]:
                member = item(member_id)
                count(member_id, kind_of(member), f"{path}::{member['name']}", trait_item=True)

    root = index[str(doc["root"])]
    walk(doc["root"], root["name"])

    by_kind = collections.Counter(kind for kind, _ in counted.values())
    if args.list:
        for kind, path in sorted(counted.values(), key=lambda pair: pair[1]):
            print(f"{kind:12} {path}")
    print(f"{len(counted)} public items")
    for kind, n in by_kind.most_common():
        print(f"  {n:4} {kind}")


if __name__ == "__main__":
    sys.exit(main())

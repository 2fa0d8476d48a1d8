#!/usr/bin/env python3
"""Writes the bad-input table of docs/RELIABILITY.md from the cases that
tests/cli/bad_input_test.cc runs, so the table is what the tests try and
what the tool answered, not a copy kept by hand.

Usage: scripts/bad_input_table.py BUILD_DIR [DOC]   (default DOC: docs/RELIABILITY.md)
Runs BUILD_DIR/tests/cli/cli_reliability_test's BadInput cases with
--gtest_output=xml and replaces the lines between the markers
<!-- bad-input-table:begin --> and <!-- bad-input-table:end --> of DOC.
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

BEGIN, END = "<!-- bad-input-table:begin -->", "<!-- bad-input-table:end -->"


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    build_dir = sys.argv[1]
    doc = sys.argv[2] if len(sys.argv) == 3 else "docs/RELIABILITY.md"
    binary = os.path.join(build_dir, "tests", "cli", "cli_reliability_test")
    with tempfile.TemporaryDirectory() as scratch:
        xml_path = os.path.join(scratch, "cases.xml")
        run = subprocess.run([binary, "--gtest_filter=EveryCommand/BadInput.*", "--gtest_output=xml:" + xml_path],
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit("bad_input_table: the BadInput cases failed; fix them first:\n" + run.stdout[-4000:])
        rows = []
        for case in ElementTree.parse(xml_path).iter("testcase"):
            properties = {p.get("name"): p.get("value") for p in case.iter("property")}
            stderr = properties.get("stderr", "")
            for key, placeholder in (("out_dir", "{out}"), ("in_dir", "{in}")):
                if properties.get(key):
                    stderr = stderr.replace(properties[key], placeholder)
            rows.append((case.get("value_param") or case.get("name"), properties.get("command", ""), stderr))
    table = [BEGIN, "", f"{len(rows)} cases; each exits 2 with this one line on stderr and writes nothing "
             "(`{in}` is a directory of inputs from `epmoe gen-inputs`, `{out}` the output directory).", "",
             "| case | command | stderr |", "|---|---|---|"]
    for name, command, stderr in rows:
        table.append(f"| {cell(name)} | `{cell(command)}` | {cell(stderr)} |")
    table += ["", END]
    text = open(doc).read()
    if BEGIN not in text or END not in text:
        sys.exit(f"bad_input_table: {doc} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(doc + ".tmp", "w") as out:
        out.write(head + "\n".join(table) + tail)
    os.replace(doc + ".tmp", doc)
    print(f"bad_input_table: {len(rows)} cases into {doc}")


if __name__ == "__main__":
    main()

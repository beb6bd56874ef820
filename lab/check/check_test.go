package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const root = "../.."

func loadDocs(t *testing.T) []*Doc {
	t.Helper()
	files, err := Docs(root)
	if err != nil {
		t.Fatal(err)
	}
	var docs []*Doc
	for _, f := range files {
		d, err := Load(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		d.Path = f
		docs = append(docs, d)
	}
	return docs
}

func report(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

// TestSnippets compiles and vets every Go snippet of README.md and
// docs/*.md, and checks that each is gofmt-clean.
func TestSnippets(t *testing.T) {
	report(t, Snippets(root, ".", loadDocs(t)))
}

// TestNumbers checks every figure marked as coming from a saved run.
func TestNumbers(t *testing.T) {
	n, errs := Numbers(root, loadDocs(t))
	report(t, errs)
	t.Logf("%d figures checked", n)
}

// TestReferences checks section numbers, § references and links.
func TestReferences(t *testing.T) {
	report(t, References(root, loadDocs(t)))
}

// TestNames checks the Go names quoted in the prose.
func TestNames(t *testing.T) {
	report(t, Names(root, loadDocs(t)))
}

// TestREADMECommands checks that CI runs the commands a newcomer is given
// first: those of the README's first code block (the demo, the tests).
func TestREADMECommands(t *testing.T) {
	readme, err := Load(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(readme.Fences) == 0 || readme.Fences[0].Lang != "sh" {
		t.Fatal("the README does not start with a sh block of commands")
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, line := range strings.Split(readme.Fences[0].Code, "\n") {
		if cmd, _, _ := strings.Cut(line, "#"); strings.TrimSpace(cmd) != "" {
			cmds = append(cmds, strings.TrimSpace(cmd))
		}
	}
	if len(cmds) != 2 {
		t.Errorf("got %d commands at the top of the README; want 2 (the demo, the tests): %q", len(cmds), cmds)
	}
	for _, cmd := range cmds {
		found := false
		for _, line := range strings.Split(string(ci), "\n") {
			found = found || strings.HasPrefix(strings.TrimSpace(line), cmd)
		}
		if !found {
			t.Errorf("the README gives %q; .ci/run does not run it", cmd)
		}
	}
}

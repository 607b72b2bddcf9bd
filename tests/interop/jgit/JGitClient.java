// A small command-line driver for JGit's porcelain API (org.eclipse.jgit.api.Git), used by
// tests/interop/test_jgit.py to talk to Enroute over smart HTTP exactly as a JGit
// application would. Output is line-oriented and tab-separated so the test can parse it:
//
//   clone URL DIR [--bare] [--depth N]
//                               ref<TAB>OID<TAB>NAME / symref<TAB>TARGET<TAB>NAME per local ref
//   init DIR URL                a new repository (branch main) with URL as its origin
//   ls-remote URL               OID<TAB>NAME (and PEELED<TAB>NAME^{} for annotated tags),
//                               symref<TAB>TARGET<TAB>NAME for symbolic refs
//   fetch DIR                   update<TAB>RESULT<TAB>OLD<TAB>NEW<TAB>LOCAL-NAME per tracking ref
//   commit DIR PATH TEXT MSG    the new commit's OID (fixed identity and date)
//   push DIR [--force] [--atomic] [--remote NAME-OR-URL] REFSPEC...
//                               push<TAB>STATUS<TAB>REMOTE-NAME<TAB>NEW-OID<TAB>MESSAGE per ref
//
// Several commands may run in one JVM, separated by --then; each one's output starts with
// command<TAB>NAME. A command may start with --protocol 0|2 (protocol.version from then on).
// Exit status: the worst of 0 done, 2 a push had a ref that was not OK or UP_TO_DATE,
// 64 bad usage; 1 an error (message and stack on stderr), which stops the run.

import java.io.File;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.eclipse.jgit.api.CloneCommand;
import org.eclipse.jgit.api.Git;
import org.eclipse.jgit.lib.ObjectId;
import org.eclipse.jgit.lib.PersonIdent;
import org.eclipse.jgit.lib.Ref;
import org.eclipse.jgit.lib.StoredConfig;
import org.eclipse.jgit.revwalk.RevCommit;
import org.eclipse.jgit.transport.FetchResult;
import org.eclipse.jgit.transport.PushResult;
import org.eclipse.jgit.transport.RefSpec;
import org.eclipse.jgit.transport.RemoteRefUpdate;
import org.eclipse.jgit.transport.TrackingRefUpdate;
import org.eclipse.jgit.transport.URIish;
import org.eclipse.jgit.util.SystemReader;

public final class JGitClient {
    private static final String NAME = "Enroute Test";
    private static final String EMAIL = "test@enroute.invalid";
    private static final Instant WHEN = Instant.ofEpochSecond(1_700_000_000L);
    private static final String THEN = "--then";
    private static final PrintStream OUT =
            new PrintStream(System.out, false, StandardCharsets.UTF_8);

    private JGitClient() {}

    public static void main(String[] argv) {
        int worst = 0;
        List<String> command = new ArrayList<>();
        try {
            for (String arg : argv) {
                if (arg.equals(THEN)) {
                    worst = Math.max(worst, run(command));
                    command = new ArrayList<>();
                } else {
                    command.add(arg);
                }
            }
            worst = Math.max(worst, run(command));
        } catch (Exception e) {
            OUT.flush();
            System.err.println("JGitClient: " + e);
            e.printStackTrace();
            worst = 1;
        }
        OUT.flush();
        System.exit(worst);
    }

    /** One command; a rejected push does not stop the ones after it, an exception does. */
    private static int run(List<String> args) throws Exception {
        if (args.size() >= 2 && args.get(0).equals("--protocol")) {
            setProtocol(args.get(1));
            args = args.subList(2, args.size());
        }
        if (args.isEmpty()) {
            return usage();
        }
        List<String> rest = args.subList(1, args.size());
        OUT.println("command\t" + args.get(0));
        return switch (args.get(0)) {
            case "clone" -> cloneRepo(rest);
            case "init" -> init(rest);
            case "ls-remote" -> lsRemote(rest);
            case "fetch" -> fetch(rest);
            case "commit" -> commit(rest);
            case "push" -> push(rest);
            default -> usage();
        };
    }

    private static int usage() {
        System.err.println("usage: JGitClient [--protocol 0|2] clone|init|ls-remote|fetch|commit|push"
                + " ARGS... [--then ...]");
        return 64;
    }

    /** Sets protocol.version in the in-memory user config, which every repo config inherits. */
    private static void setProtocol(String version) throws Exception {
        StoredConfig user = SystemReader.getInstance().getUserConfig();
        user.setString("protocol", null, "version", version);
    }

    private static int cloneRepo(List<String> args) throws Exception {
        if (args.size() < 2) {
            return usage();
        }
        CloneCommand clone = Git.cloneRepository()
                .setURI(args.get(0))
                .setDirectory(new File(args.get(1)))
                .setCloneAllBranches(true);
        for (int i = 2; i < args.size(); i++) {
            switch (args.get(i)) {
                case "--bare" -> clone.setBare(true);
                case "--depth" -> clone.setDepth(Integer.parseInt(args.get(++i)));
                default -> {
                    return usage();
                }
            }
        }
        try (Git git = clone.call()) {
            printLocalRefs(git);
        }
        return 0;
    }

    private static int init(List<String> args) throws Exception {
        if (args.size() != 2) {
            return usage();
        }
        try (Git git = Git.init()
                .setDirectory(new File(args.get(0)))
                .setInitialBranch("main")
                .call()) {
            git.remoteAdd().setName("origin").setUri(new URIish(args.get(1))).call();
        }
        return 0;
    }

    private static void printLocalRefs(Git git) throws Exception {
        for (Ref ref : git.getRepository().getRefDatabase().getRefs()) {
            if (ref.isSymbolic()) {
                OUT.println("symref\t" + ref.getTarget().getName() + "\t" + ref.getName());
            } else if (ref.getObjectId() != null) {
                OUT.println("ref\t" + ref.getObjectId().name() + "\t" + ref.getName());
            }
        }
    }

    private static int lsRemote(List<String> args) throws Exception {
        if (args.size() != 1) {
            return usage();
        }
        Map<String, Ref> refs = new TreeMap<>(Git.lsRemoteRepository()
                .setRemote(args.get(0))
                .setHeads(false)
                .setTags(false)
                .callAsMap());
        for (Ref ref : refs.values()) {
            if (ref.isSymbolic()) {
                OUT.println("symref\t" + ref.getTarget().getName() + "\t" + ref.getName());
            }
            if (ref.getObjectId() != null) {
                OUT.println(ref.getObjectId().name() + "\t" + ref.getName());
            }
            if (ref.getPeeledObjectId() != null) {
                OUT.println(ref.getPeeledObjectId().name() + "\t" + ref.getName() + "^{}");
            }
        }
        return 0;
    }

    private static int fetch(List<String> args) throws Exception {
        if (args.size() != 1) {
            return usage();
        }
        try (Git git = Git.open(new File(args.get(0)))) {
            FetchResult result = git.fetch().setRemote("origin").call();
            for (TrackingRefUpdate update : result.getTrackingRefUpdates()) {
                OUT.println("update\t" + update.getResult() + "\t" + update.getOldObjectId().name()
                        + "\t" + update.getNewObjectId().name() + "\t" + update.getLocalName());
            }
        }
        return 0;
    }

    private static int commit(List<String> args) throws Exception {
        if (args.size() != 4) {
            return usage();
        }
        try (Git git = Git.open(new File(args.get(0)))) {
            File work = git.getRepository().getWorkTree();
            File target = new File(work, args.get(1));
            Files.createDirectories(target.toPath().getParent());
            Files.writeString(target.toPath(), args.get(2), StandardCharsets.UTF_8);
            git.add().addFilepattern(args.get(1)).call();
            PersonIdent who = new PersonIdent(NAME, EMAIL, WHEN, ZoneOffset.UTC);
            RevCommit made = git.commit()
                    .setMessage(args.get(3))
                    .setAuthor(who)
                    .setCommitter(who)
                    .setSign(Boolean.FALSE)
                    .call();
            OUT.println(made.getId().name());
        }
        return 0;
    }

    private static int push(List<String> args) throws Exception {
        if (args.isEmpty()) {
            return usage();
        }
        boolean force = false;
        boolean atomic = false;
        String remote = "origin";
        List<RefSpec> specs = new ArrayList<>();
        for (int i = 1; i < args.size(); i++) {
            switch (args.get(i)) {
                case "--force" -> force = true;
                case "--atomic" -> atomic = true;
                case "--remote" -> remote = args.get(++i);
                default -> specs.add(new RefSpec(args.get(i)));
            }
        }
        boolean allOk = true;
        try (Git git = Git.open(new File(args.get(0)))) {
            Iterable<PushResult> results = git.push()
                    .setRemote(remote)
                    .setRefSpecs(specs)
                    .setForce(force)
                    .setAtomic(atomic)
                    .call();
            for (PushResult result : results) {
                Collection<RemoteRefUpdate> updates = result.getRemoteUpdates();
                for (RemoteRefUpdate update : updates) {
                    RemoteRefUpdate.Status status = update.getStatus();
                    ObjectId pushed = update.getNewObjectId();
                    String message = update.getMessage() == null ? "" : update.getMessage();
                    OUT.println("push\t" + status + "\t" + update.getRemoteName() + "\t"
                            + (pushed == null ? ObjectId.zeroId().name() : pushed.name()) + "\t"
                            + message.replace('\n', ' ').replace('\t', ' '));
                    allOk &= status == RemoteRefUpdate.Status.OK
                            || status == RemoteRefUpdate.Status.UP_TO_DATE;
                }
            }
        }
        return allOk ? 0 : 2;
    }
}

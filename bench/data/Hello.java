// Input for the javac entry of bench/suite.toml.
import java.util.List;
import java.util.stream.Collectors;

public class Hello {
    public static void main(String[] args) {
        List<String> words = List.of("cold", "warm", "prefetched");
        System.out.println(words.stream().map(String::toUpperCase).collect(Collectors.joining(" ")));
    }
}
